"""Two stages in one script: two ``model.train`` calls (pre-training, then fine-tuning another
dataset with a new Model and optimizer over the same net), each with its own ResumeCallback; a
user would be let down if a fault in the fine-tuning ran the pre-training again, or continued
the fine-tuning from the wrong step.

The kill comes in the fine-tuning, by itself: each stage numbers its steps from 1, so the check's
``--at`` (a step of any stage) cannot aim at the second. The check runs the script uninterrupted,
again to be killed, then relaunched with MSCON_RESUME=1, each in a folder of its own that links the
current folder's files: launches.txt, which the test puts there holding 0, counts the launches of
all three, and the second launch SIGKILLs itself at the fine-tuning's step 5 (so the check's own
kill never comes).

EXPECT: exact
PATTERN: 9
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

ms.set_seed(1)


class Fault(Callback):
    def on_train_step_end(self, run_context):
        if KILL and run_context.original_args().cur_step_num == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # a lost node, in the fine-tuning


rng = np.random.default_rng(0)
x = rng.standard_normal((96, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
pretrain = ds.NumpySlicesDataset({"data": x[:64], "label": y[:64]}, shuffle=True).batch(8)
finetune = ds.NumpySlicesDataset({"data": x[64:], "label": y[64:]}, shuffle=True).batch(4)
net = nn.Dense(4, 2)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

model = Model(net, loss_fn=loss_fn, optimizer=nn.Momentum(net.trainable_params(), 0.1, 0.9))
resume = mscon_resume.ResumeCallback(pretrain, name="pretrain")
model.train(
    2,
    pretrain,
    callbacks=[LossMonitor(), resume],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)
print("pre-training finished")

tune = Model(net, loss_fn=loss_fn, optimizer=nn.Adam(net.trainable_params(), 0.01))
resume = mscon_resume.ResumeCallback(finetune, name="finetune")
tune.train(
    2,
    finetune,
    callbacks=[LossMonitor(), resume, Fault()],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)
print("fine-tuning finished")
