"""Lifecycle: ``Model.fit`` with a validation dataset (validated after every epoch), killed
(SIGKILL) during the last validation, after the last training step; a user would be let down if
the relaunch trained again, or failed because training is over, instead of running the last
validation again.

The kill comes once, by itself: The check runs the script uninterrupted, again to be killed, then
relaunched with MSCON_RESUME=1, each in a folder of its own that links the current folder's files:
launches.txt, which the test puts there holding 0, counts the launches of all three, and the second
launch is the one killed (so the check's own kill never comes: AT is past the end).

EXPECT: exact
PATTERN: 7
AT: 999
"""

import os
import signal
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Callback, LossMonitor, Model

import mscon_resume

launches = Path("launches.txt")
launch = int(launches.read_text()) + 1 if launches.exists() else 1
launches.write_text(str(launch))
KILL = launch == 2 and "MSCON_RESUME" not in os.environ
EPOCHS = 3

ms.set_seed(1)


class Validation(Callback):
    def on_eval_step_end(self, run_context):
        cb = run_context.original_args()
        if KILL and cb.cur_epoch_num == EPOCHS and cb.cur_step_num == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # a lost node, in the middle of the last validation

    def on_eval_end(self, run_context):
        cb = run_context.original_args()
        print(f"epoch {cb.cur_epoch_num} validation: {cb.eval_results}")


rng = np.random.default_rng(0)
x = rng.standard_normal((96, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
train = ds.NumpySlicesDataset({"data": x[:64], "label": y[:64]}, shuffle=True).batch(8)
valid = ds.NumpySlicesDataset({"data": x[64:], "label": y[64:]}, shuffle=False).batch(8)
net = nn.Dense(4, 2)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
model = Model(net, loss_fn=loss_fn, optimizer=optimizer, metrics={"accuracy"})
resume = mscon_resume.ResumeCallback(train)
model.fit(
    EPOCHS,
    train,
    valid,
    callbacks=[LossMonitor(), resume, Validation()],
    initial_epoch=resume.initial_epoch,
)
print("training finished")
