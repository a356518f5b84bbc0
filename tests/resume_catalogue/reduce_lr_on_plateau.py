"""``mindspore.experimental.optim.lr_scheduler.ReduceLROnPlateau`` stepped with each batch's loss
(its best, wait and cooldown are Parameters of the scheduler object), in keep; a user would be
let down if the resumed run forgot the plateau it was on and kept a learning rate it had cut.

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
optimizer = optim.SGD(net.trainable_params(), lr=0.5, momentum=0.9)
scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=1)
loss_fn = nn.CrossEntropyLoss()


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer, scheduler)):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        scheduler.step(loss)
        lr = float(scheduler.get_last_lr()[0])
        print(f"epoch {epoch} step {i} loss {float(loss):.8f} lr {lr:.6g}")
print("training finished")
