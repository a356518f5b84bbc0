"""``mindspore.experimental.optim.Adam`` with a ``lr_scheduler.StepLR`` stepped at every batch,
both in keep; a user would be let down if the resumed run started the schedule again (a high
learning rate late in training).

EXPECT: exact
PATTERN: 3
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.experimental import optim

import mscon_resume

ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x[:, 0] * x[:, 1] > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2))
optimizer = optim.Adam(net.trainable_params(), lr=0.05)
scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
loss_fn = nn.CrossEntropyLoss()


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer, scheduler)):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        scheduler.step()
        lr = float(scheduler.get_last_lr()[0])
        print(f"epoch {epoch} step {i} loss {float(loss):.8f} lr {lr:.6g}")
print("training finished")
