"""``batches()`` given ``dataset.create_tuple_iterator()`` instead of the dataset: an iterator
cannot be started at a step, so a user would be let down by a resume that silently replayed the
epoch from its start; the library stops the first launch already, in one line whose fix is: pass
the dataset (a TypeError before any step: nothing runs that a relaunch could not resume).

EXPECT: fails
PATTERN: 10
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mscon_resume

ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    batches = dataset.create_tuple_iterator()
    for i, (data, label) in mscon_resume.batches(batches, epoch, keep=(net, optimizer)):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
