"""``ops.standard_normal`` noise added to the inputs in each step (MindSpore's op seed counters
move at every call); a user would be let down if the resumed steps drew the first steps' noise.

EXPECT: exact
PATTERN: 2
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
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    data = data + 0.3 * ops.standard_normal(data.shape)
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
