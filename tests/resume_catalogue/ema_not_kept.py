"""EMA weights (a user class holding a ParameterTuple of shadow weights updated at every step) NOT in
keep; a user would be let down by a resume that restarted the average from the initial weights: the
library must refuse a Parameter that changes in training and is not kept.

EXPECT: refused
PATTERN: 5
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops

import mscon_resume

ms.set_seed(1)


class EMA:
    """Shadow weights: an exponential moving average of the net's, updated after each step."""

    def __init__(self, net, decay=0.9):
        self.decay = decay
        self.weights = net.trainable_params()
        self.shadow = ms.ParameterTuple(w.clone() for w in self.weights)
        for s, w in zip(self.shadow, self.weights, strict=True):
            s.name = "ema." + w.name

    def update(self):
        for s, w in zip(self.shadow, self.weights, strict=True):
            ops.assign(s, self.decay * s + (1 - self.decay) * w)


rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
ema = EMA(net)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        ema.update()
        shadow = float(ema.shadow[0].abs().sum())
        print(f"epoch {epoch} step {i} loss {float(loss):.8f} ema {shadow:.8f}")
print("training finished")
