"""Lifecycle: ``model.eval`` on the training dataset after a resumed ``model.train``; a user
would be let down if the evaluation skipped the batches the resume skipped (the dataset must start
at its beginning again once training is over).

EXPECT: exact
PATTERN: 7
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import LossMonitor, Model

import mscon_resume

ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(8)
net = nn.Dense(4, 2)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
model = Model(net, loss_fn=loss_fn, optimizer=optimizer, metrics={"accuracy", "loss"})
resume = mscon_resume.ResumeCallback(dataset)
model.train(
    3, dataset, callbacks=[LossMonitor(), resume], dataset_sink_mode=False, initial_epoch=resume.initial_epoch
)
print("evaluation on the training set:", model.eval(dataset, dataset_sink_mode=False))
print("batches evaluated:", sum(1 for _ in dataset.create_tuple_iterator()))
