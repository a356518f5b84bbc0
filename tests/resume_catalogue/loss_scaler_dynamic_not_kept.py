"""mindspore.amp.DynamicLossScaler (a scale near float32's limit, so steps overflow, are skipped and
the scale moves) NOT in keep; its scale_value and counter Parameters change in training, so a user
would be let down by a resume that started again from the initial scale: the library must refuse
it.

EXPECT: refused
PATTERN: 3
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.amp import DynamicLossScaler, all_finite

import mscon_resume

ms.set_seed(1)

rng = np.random.default_rng(0)
x = 50 * rng.standard_normal((64, 4)).astype(np.float32)  # large inputs: large gradients
y = (x[:, 0] * x[:, 1] > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.001, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
loss_scaler = DynamicLossScaler(scale_value=2.0**122, scale_factor=2, scale_window=3)


def forward_fn(data, label):
    return loss_scaler.scale(loss_fn(net(data), label))


grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)


def train_step(data, label):
    scaled_loss, grads = grad_fn(data, label)
    loss, grads = loss_scaler.unscale(scaled_loss), loss_scaler.unscale(grads)
    finite = all_finite(grads)
    loss_scaler.adjust(finite)
    if finite:
        optimizer(grads)
    return loss, finite


train_step = mscon_resume.track_loss(train_step)

for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
        loss, finite = train_step(data, label)
        scale = float(loss_scaler.scale_value)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f} finite {bool(finite)} scale {scale:.4g}")
print("training finished")
