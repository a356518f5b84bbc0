"""A hand-written MindSpore loop over a NumpySlicesDataset, sharded by rank, with mscon_resume's
batches keeping the network and its optimizer (TWO_OPTIMIZERS=1: two Adams in an unnamed tuple,
whose like-named state, beta1_power and global_step among it, a relaunch cannot tell apart)."""

import os

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

import mscon_resume

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((128, 8)).astype(np.float32)
y = (x @ rng.standard_normal((8, 3)).astype(np.float32)).argmax(axis=1).astype(np.int32)
data = ds.NumpySlicesDataset(
    {"x": x, "y": y}, shuffle=True, num_shards=get_group_size(), shard_id=get_rank()
).batch(8)  # 64 samples a rank: 8 steps an epoch

net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 3))
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Adam(net.trainable_params(), 0.01)
keep = (net, optimizer)
if os.environ.get("TWO_OPTIMIZERS") == "1":
    keep = (net, optimizer, nn.Adam(net.trainable_params(), 0.001))


def forward(inputs, target):
    return loss_fn(net(inputs), target)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward, None, net.trainable_params()))
reducer = nn.DistributedGradReducer(optimizer.parameters)

for epoch in range(3):
    for i, (inputs, target) in mscon_resume.batches(data, epoch, keep=keep):
        loss, grads = grad_fn(inputs, target)
        optimizer(reducer(grads))
        print(f"epoch {epoch} step {i} loss {loss}")
print("done")
