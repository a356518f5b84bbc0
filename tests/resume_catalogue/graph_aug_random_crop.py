"""GRAPH_MODE: random augmentation in the pipeline's map (RandomCrop, RandomHorizontalFlip) and a
compiled train step; a user would be let down if the graph-compiled run resumed with other crops.

EXPECT: exact
PATTERN: 1
SUITE: slow
"""

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.vision as vision
import numpy as np
from mindspore import nn

import mscon_resume

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(1)

rng = np.random.default_rng(0)
images = rng.integers(0, 256, (64, 8, 8, 3), dtype=np.uint8)
labels = rng.integers(0, 2, 64).astype(np.int32)

dataset = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True)
augment = [vision.RandomCrop(8, padding=2), vision.RandomHorizontalFlip()]
dataset = dataset.map(augment + [vision.Rescale(1 / 255, 0), vision.HWC2CHW()], "image")
dataset = dataset.batch(8)

net = nn.SequentialCell(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dense(4 * 8 * 8, 2))
optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
train_net = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
train_net.set_train()
step = mscon_resume.track_loss(train_net)

for epoch in range(5):  # 40 steps: compiled steps are quick, the check kills a few steps late
    for i, (image, label) in mscon_resume.batches(dataset, epoch, keep=(train_net,)):
        loss = step(image, label)
        print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
