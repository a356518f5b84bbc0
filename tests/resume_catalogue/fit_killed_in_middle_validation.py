"""Lifecycle: ``Model.fit`` with a validation dataset (validated after every epoch), killed
(SIGKILL) during the second epoch's validation, after its last training step, with a callback that
keeps every validation's result (in ``keep``); a user would be let down if the relaunch went on
with the third epoch and that validation were never run: the history (and a best-model choice
made from it) would lack the second epoch. A resume never starts at an epoch's last step: the
step before is kept and resumed from, so the epoch's end runs again.

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
    def __init__(self):
        self.history = []

    def on_eval_step_end(self, run_context):
        cb = run_context.original_args()
        if KILL and cb.cur_epoch_num == 2 and cb.cur_step_num == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # a lost node, in the middle of a validation

    def on_eval_end(self, run_context):
        cb = run_context.original_args()
        self.history.append(round(float(cb.eval_results["accuracy"]), 6))
        print(f"epoch {cb.cur_epoch_num} validation: {cb.eval_results} history {self.history}")


rng = np.random.default_rng(0)
x = rng.standard_normal((96, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
train = ds.NumpySlicesDataset({"data": x[:64], "label": y[:64]}, shuffle=True).batch(8)
valid = ds.NumpySlicesDataset({"data": x[64:], "label": y[64:]}, shuffle=False).batch(8)
net = nn.Dense(4, 2)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
model = Model(net, loss_fn=loss_fn, optimizer=optimizer, metrics={"accuracy"})
validation = Validation()
resume = mscon_resume.ResumeCallback(train, keep={"validation": validation})
model.fit(
    EPOCHS,
    train,
    valid,
    callbacks=[LossMonitor(), resume, validation],
    initial_epoch=resume.initial_epoch,
)
print("training finished")
