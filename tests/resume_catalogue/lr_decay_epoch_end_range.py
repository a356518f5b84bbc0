"""The learning rate halved in place at each epoch's end (ops.assign on optimizer.learning_rate) in a plain
for epoch in range(N); a user would be let down by a resume whose done epochs run their epoch-end
code again (the restored rate halved once more for each): the library must refuse it.

EXPECT: refused
PATTERN: 6
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
optimizer = nn.Momentum(net.trainable_params(), 0.4, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(4):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
    ops.assign(optimizer.learning_rate, optimizer.learning_rate * 0.5)
    print(f"epoch {epoch} done: learning rate {float(optimizer.learning_rate):.6g}")
print("training finished")
