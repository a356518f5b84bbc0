"""Gradient accumulation over 2 batches, the sums held in a ParameterTuple that is in keep; a
user would be let down if a resume between the two batches of an update lost the first half.

EXPECT: exact
PATTERN: 3
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops

import mscon_resume

ms.set_seed(1)
ACCUMULATE = 2

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
accumulated = optimizer.parameters.clone(prefix="accumulated", init="zeros")  # a ParameterTuple
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label) / ACCUMULATE


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer, accumulated)):
        loss, grads = grad_fn(data, label)
        for total, grad in zip(accumulated, grads, strict=True):
            ops.assign_add(total, grad)
        if (i + 1) % ACCUMULATE == 0:
            optimizer(tuple(accumulated))
            for total in accumulated:
                ops.assign(total, ops.zeros_like(total))
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
