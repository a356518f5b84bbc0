"""Two stages in one script: two ``model.train`` calls (pre-training, then fine-tuning another
dataset with a new Model and optimizer over the same net), each with its own ResumeCallback; a
user would be let down if a fault in the fine-tuning ran the pre-training again, or continued
the fine-tuning from the wrong step.

EXPECT: exact
PATTERN: 9
AT: 21
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import LossMonitor, Model

import mscon_resume

ms.set_seed(1)

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
    callbacks=[LossMonitor(), resume],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)
print("fine-tuning finished")
