"""Two stages in one script: a training loop over ``batches()``, then a fine-tuning loop over
another dataset with its own optimizer (a second plain ``batches()`` loop starting again at
epoch 0: a new stage); a user would be let down if a fault in the fine-tuning ran the first stage
again, or continued the fine-tuning from the wrong step.

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

import mscon_resume

launches = Path("launches.txt")
launch = int(launches.read_text()) + 1 if launches.exists() else 1
launches.write_text(str(launch))
KILL = launch == 2 and "MSCON_RESUME" not in os.environ

ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((96, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
pretrain = ds.NumpySlicesDataset({"data": x[:64], "label": y[:64]}, shuffle=True).batch(8)
finetune = ds.NumpySlicesDataset({"data": x[64:], "label": y[64:]}, shuffle=True).batch(4)
net = nn.Dense(4, 2)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))
for epoch in range(2):
    for i, (data, label) in mscon_resume.batches(pretrain, epoch, keep=(net, optimizer)):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        print(f"pretrain epoch {epoch} step {i} loss {float(loss):.8f}")

tune_optimizer = nn.Adam(net.trainable_params(), 0.01)
tune_grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, tune_optimizer.parameters))
for epoch in range(2):
    for i, (data, label) in mscon_resume.batches(finetune, epoch, keep=(net, tune_optimizer)):
        if KILL and epoch * 8 + i == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # a lost node, in the fine-tuning
        loss, grads = tune_grad_fn(data, label)
        tune_optimizer(grads)
        print(f"finetune epoch {epoch} step {i} loss {float(loss):.8f}")
print("training finished")
