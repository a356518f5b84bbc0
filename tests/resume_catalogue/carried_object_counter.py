"""A trainer object counts its steps in an attribute (``self.step += 1``) that drives the
learning rate, and the script keeps only the network and optimizer: a user would be let down by
a resume that starts the count again. The library cannot hold an object it was not given, so the
relaunch refuses in one line and names the fix (add the trainer to keep).

EXPECT: refused
PATTERN: 3
SUITE: slow
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops

import mscon_resume

ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)


class Trainer:
    def __init__(self):
        self.net = nn.Dense(4, 2)
        self.optimizer = nn.SGD(self.net.trainable_params(), 0.1)
        self.loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.grad_fn = ms.value_and_grad(self.forward, None, self.optimizer.parameters)
        self.step = 0

    def forward(self, data, label):
        return self.loss_fn(self.net(data), label)

    def fit(self, epochs):
        for epoch in range(epochs):
            for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(self.net, self.optimizer)):
                self.step += 1
                lr = 0.1 / (1 + 0.05 * self.step)
                ops.assign(self.optimizer.learning_rate, ms.Tensor(lr, ms.float32))
                loss, grads = self.grad_fn(data, label)
                self.optimizer(grads)
                print(f"epoch {epoch} step {i} loss {float(loss):.8f} lr {lr:.6f}")


Trainer().fit(3)
print("training finished")
