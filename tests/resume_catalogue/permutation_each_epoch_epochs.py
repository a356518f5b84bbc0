"""The script draws ``np.random.permutation`` at each epoch's start to order its samples, in
``for epoch in mscon_resume.epochs(N)``; a user would be let down if the resumed epoch drew
another order than the uninterrupted run's.

EXPECT: exact
PATTERN: 2
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
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in mscon_resume.epochs(3, keep=(net, optimizer)):
    order = np.random.permutation(len(x))
    dataset = ds.NumpySlicesDataset({"data": x[order], "label": y[order]}, shuffle=False).batch(8)
    for i, (data, label) in mscon_resume.batches(dataset, epoch):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
