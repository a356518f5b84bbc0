"""Another rank count: this data-parallel script ran on 2 ranks (msrun) and is relaunched with
MSCON_RESUME=1 on 1 rank; each rank's snapshot holds its own shard's position, so a user would be
let down by a 1-rank resume that silently skipped or repeated samples: the library must refuse it.
Checked by its own test (tests/trainer/test_resume_catalogue.py), which launches msrun itself.

EXPECT: refused
PATTERN: 11
RANKS: 2
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

import mscon_resume

ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
init()
ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((128, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset(
    {"data": x, "label": y}, shuffle=True, num_shards=get_group_size(), shard_id=get_rank()
).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))
grad_reducer = nn.DistributedGradReducer(optimizer.parameters)

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
        loss, grads = grad_fn(data, label)
        optimizer(grad_reducer(grads))
        print(f"rank {get_rank()} epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
