"""``nn.Dropout`` in the net (PyNative, CPU); a user would be let down by a resume check that
called a run exact which cannot even repeat itself: measured on MindSpore 2.10 CPU, two
uninterrupted runs of this script (with mscon_resume or with a plain ``enumerate(dataset)``, and
with ``ms.set_context(deterministic="ON")`` too) print different losses from a step that varies
from run to run (epoch 0 step 6 in one pair, epoch 1 step 1 in another), while the same script
without the Dropout repeats bit for bit, so the check must find the divergence.

EXPECT: differs
PATTERN: 12
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
net = nn.SequentialCell(nn.Dense(4, 16), nn.ReLU(), nn.Dropout(p=0.5), nn.Dense(16, 2))
net.set_train()
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
