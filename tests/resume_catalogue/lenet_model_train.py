"""The docs' LeNet ``Model.train`` shape on one rank (28x28 images, ``ResumeCallback`` beside
LossMonitor); a user would be let down if the tutorial's own shape did not continue at the loss it
stopped at.

EXPECT: exact
PATTERN: base
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import LossMonitor, Model

import mscon_resume

ms.set_seed(1)


class LeNet5(nn.Cell):
    def __init__(self, num_class=10, num_channel=1):
        super().__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.fc1 = nn.Dense(16 * 4 * 4, 120)
        self.fc2 = nn.Dense(120, 84)
        self.fc3 = nn.Dense(84, num_class)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


rng = np.random.default_rng(0)
images = rng.integers(0, 256, (64, 28, 28, 1), dtype=np.uint8)
labels = rng.integers(0, 10, 64).astype(np.int32)
data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True)
data = data.map([ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.HWC2CHW()], "image")
data = data.batch(8, drop_remainder=True)

net = LeNet5()
loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
model = Model(net, loss_fn=loss, optimizer=nn.Momentum(net.trainable_params(), 0.01, 0.9))
resume = mscon_resume.ResumeCallback(data)
model.train(
    3,
    data,
    callbacks=[LossMonitor(), resume],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)
print("training finished")
