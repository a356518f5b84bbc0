"""Lifecycle: ``model.train`` (with ResumeCallback) returned, then the evaluation after it fails;
a user would be let down if the relaunch trained again, or failed because training is over,
instead of going straight to the evaluation and running it again.

The fault comes once, by itself: The check runs the script uninterrupted, again to be killed, then
relaunched with MSCON_RESUME=1, each in a folder of its own that links the current folder's files:
launches.txt, which the test puts there holding 0, counts the launches of all three, and the second
launch is the one that fails (so the check's own kill never comes: AT is past the end).

EXPECT: exact
PATTERN: 7
AT: 999
"""

import os
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Accuracy, LossMonitor, Model

import mscon_resume

launches = Path("launches.txt")
launch = int(launches.read_text()) + 1 if launches.exists() else 1
launches.write_text(str(launch))
FAULT = launch == 2 and "MSCON_RESUME" not in os.environ

ms.set_seed(1)


class FlakyAccuracy(Accuracy):
    """Accuracy whose evaluation fails once (an evaluation node lost, say)."""

    def update(self, *inputs):
        if FAULT:
            raise RuntimeError("evaluation failed")
        super().update(*inputs)


rng = np.random.default_rng(0)
x = rng.standard_normal((80, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
train = ds.NumpySlicesDataset({"data": x[:64], "label": y[:64]}, shuffle=True).batch(8)
test = ds.NumpySlicesDataset({"data": x[64:], "label": y[64:]}, shuffle=False).batch(8)
net = nn.Dense(4, 2)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
model = Model(net, loss_fn=loss_fn, optimizer=optimizer, metrics={"accuracy": FlakyAccuracy()})
resume = mscon_resume.ResumeCallback(train)
model.train(
    3, train, callbacks=[LossMonitor(), resume], dataset_sink_mode=False, initial_epoch=resume.initial_epoch
)
print("evaluation:", model.eval(test, dataset_sink_mode=False))
