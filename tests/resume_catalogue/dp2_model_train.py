"""Two ranks (msrun), data parallel, ``Model.train`` with ResumeCallback and random augmentation
(RandomHorizontalFlip) in each rank's shard; a user would be let down if the two ranks did not
agree on the step and continue at the losses they stopped at.

EXPECT: exact
PATTERN: base
SUITE: slow
RANKS: 2
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import LossMonitor, Model

import mscon_resume

ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
init()
ms.set_seed(1)

rng = np.random.default_rng(0)
images = rng.integers(0, 256, (128, 8, 8, 3), dtype=np.uint8)
labels = rng.integers(0, 2, 128).astype(np.int32)
data = ds.NumpySlicesDataset(
    {"image": images, "label": labels}, shuffle=True, num_shards=get_group_size(), shard_id=get_rank()
)
data = data.map(
    [ds.vision.RandomHorizontalFlip(), ds.vision.Rescale(1 / 255, 0), ds.vision.HWC2CHW()], "image"
)
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
