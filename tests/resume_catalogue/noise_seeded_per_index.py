"""A GeneratorDataset source adds noise from a Generator seeded per sample
(``np.random.default_rng(seed + index)``) in __getitem__; a user would be let down if noise that
depends on nothing but the index came out otherwise after a resume.

EXPECT: exact
PATTERN: 2
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mscon_resume

ms.set_seed(1)
SEED = 1234


class NoisySamples:
    def __init__(self):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((64, 4)).astype(np.float32)
        self.y = (self.x.sum(axis=1) > 0).astype(np.int32)

    def __getitem__(self, index):
        noise = np.random.default_rng(SEED + index).normal(0.0, 0.3, 4).astype(np.float32)
        return self.x[index] + noise, self.y[index]

    def __len__(self):
        return len(self.x)


dataset = ds.GeneratorDataset(NoisySamples(), ["data", "label"], shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
