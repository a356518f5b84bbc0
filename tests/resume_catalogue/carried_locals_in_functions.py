"""The loop's own bookkeeping in functions, as tutorials write it: ``train_one_epoch`` sums the
epoch's loss in a local (``total += ...``) and counts steps across epochs in a nonlocal-free
counter it returns; ``main`` (over ``mscon_resume.epochs``) keeps the best epoch so far and a
list of epoch losses. A user would
be let down by a resume that prints another epoch average, another best or a shorter history:
the library keeps every value the loops carry, in the frames that hold them.

EXPECT: exact
PATTERN: 3
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mscon_resume

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


def train_one_epoch(epoch, steps_done):
    total, seen = 0.0, 0
    for i, (data, label) in mscon_resume.batches(dataset, epoch):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        total += float(loss)
        seen += 1
        steps_done += 1
        print(f"epoch {epoch} step {i} loss {float(loss):.8f} running {total / seen:.8f} done {steps_done}")
    return total / max(seen, 1), steps_done


def main():
    best, best_epoch, history, steps_done = float("inf"), -1, [], 0
    for epoch in mscon_resume.epochs(3, keep=(net, optimizer)):
        average, steps_done = train_one_epoch(epoch, steps_done)
        history.append(round(average, 8))
        if average < best:
            best, best_epoch = average, epoch
        print(f"epoch {epoch} average {average:.8f} best {best:.8f} at {best_epoch} history {history}")
    print(f"training finished after {steps_done} steps")


main()
