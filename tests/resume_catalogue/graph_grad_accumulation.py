"""GRAPH_MODE: gradient accumulation over 2 batches in compiled Cells, the sums in a
ParameterTuple of the accumulating Cell, which is in keep; a user would be let down if a resume
between the two batches of an update lost the first half.

EXPECT: exact
PATTERN: 3
SUITE: slow
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops

import mscon_resume

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(1)


class Accumulate(nn.Cell):
    """Adds each batch's gradients to its sums; ``apply`` steps the optimizer with them and clears."""

    def __init__(self, network, optimizer):
        super().__init__()
        self.network, self.optimizer = network, optimizer
        self.weights = optimizer.parameters
        self.sums = self.weights.clone(prefix="sums", init="zeros")
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, data, label):
        loss = self.network(data, label)
        grads = self.grad(self.network, self.weights)(data, label)
        for total, grad in zip(self.sums, grads):  # noqa: B905 - graph syntax: no zip(strict=)
            ops.assign_add(total, grad / 2)
        return loss


class Apply(nn.Cell):
    def __init__(self, accumulate):
        super().__init__()
        self.sums, self.optimizer = accumulate.sums, accumulate.optimizer

    def construct(self):
        self.optimizer(self.sums)
        for total in self.sums:
            ops.assign(total, ops.zeros_like(total))
        return True


rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
accumulate = Accumulate(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(True, "mean")), optimizer)
apply = Apply(accumulate)
step = mscon_resume.track_loss(accumulate)

for epoch in range(5):  # 40 steps: compiled steps are quick, the check kills a few steps late
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(accumulate,)):
        loss = step(data, label)
        if (i + 1) % 2 == 0:
            apply()
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
