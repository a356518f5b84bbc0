"""GRAPH_MODE, as the docs' net.py is: a hand-written loop over ``mscon_resume.batches`` whose
``value_and_grad`` step is compiled; a user would be let down if the compiled run did not continue
at the loss it stopped at.

EXPECT: exact
PATTERN: base
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mscon_resume

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(1)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 4, 10, weight_init="normal", bias_init="zeros")
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.fc(self.flatten(x)))


rng = np.random.default_rng(0)
images = rng.standard_normal((64, 1, 4, 4)).astype(np.float32)
labels = rng.integers(0, 10, 64).astype(np.int32)
data_set = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True).batch(8)
net = Network()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.SGD(net.trainable_params(), 1e-1)


def forward_fn(inputs, target):
    logits = net(inputs)
    return loss_fn(logits, target), logits


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, net.trainable_params(), has_aux=True))

for epoch in range(5):  # 40 steps: compiled steps are quick, the check kills a few steps late
    for i, (data, label) in mscon_resume.batches(data_set, epoch, keep=(net, optimizer)):
        (loss, _), grads = grad_fn(data, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
