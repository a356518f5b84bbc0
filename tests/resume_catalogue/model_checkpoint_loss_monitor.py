"""``Model.train`` with ``ModelCheckpoint`` (every 5 steps, the last 3 kept, in ./checkpoints) and
``LossMonitor(per_print_times=5)`` beside ResumeCallback; a user would be let down if the resumed
run saved other steps, under other file names (ModelCheckpoint renames its prefix when it finds
files of an earlier run), or printed its losses at other steps.

EXPECT: exact
PATTERN: 8
"""

import os

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import CheckpointConfig, LossMonitor, Model, ModelCheckpoint

import mscon_resume

ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
model = Model(net, loss_fn=loss_fn, optimizer=nn.Momentum(net.trainable_params(), 0.1, 0.9))
ckpt = ModelCheckpoint(
    prefix="dense",
    directory="checkpoints",
    config=CheckpointConfig(save_checkpoint_steps=5, keep_checkpoint_max=3),
)
resume = mscon_resume.ResumeCallback(dataset)
model.train(
    4,
    dataset,
    callbacks=[LossMonitor(per_print_times=5), ckpt, resume],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)
print("checkpoints:", sorted(os.listdir("checkpoints")))
