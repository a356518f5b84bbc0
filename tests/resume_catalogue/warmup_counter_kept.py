"""A linear learning-rate warm-up driven by the script's own counter object
(``class Warmup: self.count``), in keep; a user would be let down if the resumed run warmed up
again from its first step.

EXPECT: exact
PATTERN: 3
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops

import mscon_resume

ms.set_seed(1)


class Warmup:
    """The learning rate rises linearly to ``peak`` over ``steps`` steps, then stays."""

    def __init__(self, optimizer, peak, steps):
        self.optimizer, self.peak, self.steps = optimizer, peak, steps
        self.count = 0

    def step(self):
        self.count += 1
        lr = self.peak * min(1.0, self.count / self.steps)
        ops.assign(self.optimizer.learning_rate, ms.Tensor(lr, ms.float32))
        return lr


rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.SGD(net.trainable_params(), 0.0)
warmup = Warmup(optimizer, peak=0.5, steps=20)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer, warmup)):
        lr = warmup.step()
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f} lr {lr:.4f}")
print("training finished")
