"""A linear learning-rate warm-up driven by a plain module-level int (``steps_done += 1``): a
user would be let down by a resume that warms up again from its first step. The loop carries the
int from step to step (it reads it before it writes it), so the library keeps it with each
snapshot and puts it back where the resumed epoch begins.

EXPECT: exact
PATTERN: 3
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops

import mscon_resume

ms.set_seed(1)
PEAK, WARMUP_STEPS = 0.5, 20

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.SGD(net.trainable_params(), 0.0)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

steps_done = 0
for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
        steps_done += 1
        lr = PEAK * min(1.0, steps_done / WARMUP_STEPS)
        ops.assign(optimizer.learning_rate, ms.Tensor(lr, ms.float32))
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f} lr {lr:.4f}")
print("training finished")
