"""Lifecycle: the script catches an exception in its loop, prints it and calls ``sys.exit(1)``
(mid-epoch, at global step 10); a user would be let down if that exit dropped the snapshots, or
if the relaunch did not continue after the last step done.

The fault comes once, by itself: The check runs the script uninterrupted, again to be killed, then
relaunched with MSCON_RESUME=1, each in a folder of its own that links the current folder's files:
launches.txt, which the test puts there holding 0, counts the launches of all three, and the second
launch is the one that fails (so the check's own kill never comes: AT is past the end).

EXPECT: exact
PATTERN: 7
AT: 999
"""

import os
import sys
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mscon_resume

launches = Path("launches.txt")
launch = int(launches.read_text()) + 1 if launches.exists() else 1
launches.write_text(str(launch))
FAULT_AT = 10 if launch == 2 and "MSCON_RESUME" not in os.environ else None

ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    return loss_fn(net(data), label)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters))

try:
    for epoch in range(3):
        for i, (data, label) in mscon_resume.batches(dataset, epoch, keep=(net, optimizer)):
            if epoch * 8 + i == FAULT_AT:
                raise RuntimeError("a corrupt batch")
            loss, grads = grad_fn(data, label)
            optimizer(grads)
            print(f"epoch {epoch} step {i} loss {float(loss):.8f}")
except RuntimeError as exc:
    print(f"training failed: {exc}")
    sys.exit(1)
print("training finished")
