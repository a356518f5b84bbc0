"""Random augmentation in the pipeline's map (RandomHorizontalFlip, RandomCrop) under
``Model.train`` with ResumeCallback; a user would be let down if the resumed epoch's images were
flipped and cropped otherwise than the uninterrupted run's.

EXPECT: exact
PATTERN: 1
"""

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.vision as vision
import numpy as np
from mindspore import nn
from mindspore.train import LossMonitor, Model

import mscon_resume

ms.set_seed(1)

rng = np.random.default_rng(0)
images = rng.integers(0, 256, (64, 8, 8, 3), dtype=np.uint8)
labels = rng.integers(0, 2, 64).astype(np.int32)
data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True)
data = data.map([vision.RandomHorizontalFlip(), vision.RandomCrop(8, padding=2)], "image")
data = data.map([vision.Rescale(1 / 255, 0), vision.HWC2CHW()], "image")
data = data.batch(8)

net = nn.SequentialCell(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dense(4 * 8 * 8, 2))
loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
model = Model(net, loss_fn=loss, optimizer=nn.Momentum(net.trainable_params(), 0.05, 0.9))
resume = mscon_resume.ResumeCallback(data)
model.train(
    3,
    data,
    callbacks=[LossMonitor(), resume],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)
print("training finished")
