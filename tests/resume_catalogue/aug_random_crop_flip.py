"""Random augmentation in the pipeline's map (RandomCrop with padding, RandomHorizontalFlip) on
small 8x8 images; a user would be let down if the resumed epoch's batches were cropped and flipped
otherwise than the uninterrupted run's.

EXPECT: exact
PATTERN: 1
"""

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.vision as vision
import numpy as np
from mindspore import nn

import mscon_resume

ms.set_seed(1)

rng = np.random.default_rng(0)
images = rng.integers(0, 256, (64, 8, 8, 3), dtype=np.uint8)  # HWC, as decoded images are
labels = rng.integers(0, 2, 64).astype(np.int32)

dataset = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True)
dataset = dataset.map(
    [
        vision.RandomCrop(8, padding=2),
        vision.RandomHorizontalFlip(),
        vision.Rescale(1.0 / 255.0, 0.0),
        vision.HWC2CHW(),
    ],
    "image",
)
dataset = dataset.batch(8)

net = nn.SequentialCell(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dense(4 * 8 * 8, 2))
optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(image, label):
    return loss_fn(net(image), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

for epoch in range(3):
    for i, (image, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
        loss, grads = grad_fn(image, label)
        optimizer(grads)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f} pixels {float(image.sum()):.4f}")
print("training finished")
