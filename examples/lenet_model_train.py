"""LeNet-5 on MNIST with ``Model.train``, as MindSpore's tutorials write it, plus mscon_resume's
callback (the three lines marked "# mscon_resume"): under mscon a restart resumes at the last
step; under plain ``msrun``, relaunch with ``MSCON_RESUME=1``.

Data: ``DATA_PATH`` (an MNIST folder: train-images-idx3-ubyte, train-labels-idx1-ubyte).
``EPOCHS`` (default 2) and ``CKPT_DIR`` (default ./checkpoints) are optional.
"""

import os

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import CheckpointConfig, LossMonitor, Model, ModelCheckpoint

import mscon_resume  # mscon_resume

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
init()
ms.set_seed(1)


class LeNet5(nn.Cell):
    def __init__(self, num_class=10, num_channel=1):
        super().__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.fc1 = nn.Dense(16 * 4 * 4, 120)
        self.fc2 = nn.Dense(120, 84)
        self.fc3 = nn.Dense(84, num_class)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def create_dataset(batch_size):
    dataset = ds.MnistDataset(os.getenv("DATA_PATH"), num_shards=get_group_size(), shard_id=get_rank())
    dataset = dataset.map([ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.HWC2CHW()], "image")
    dataset = dataset.map(ds.transforms.TypeCast(ms.int32), "label")
    return dataset.batch(batch_size, drop_remainder=True)


data = create_dataset(32)
net = LeNet5()
loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
model = Model(net, loss_fn=loss, optimizer=nn.Momentum(net.trainable_params(), 0.01, 0.9))
ckpt = ModelCheckpoint(
    prefix=f"lenet_rank{get_rank()}",
    directory=os.getenv("CKPT_DIR", "checkpoints"),
    config=CheckpointConfig(save_checkpoint_steps=50, keep_checkpoint_max=2),
)
resume = mscon_resume.ResumeCallback(data)  # mscon_resume
epochs = int(os.getenv("EPOCHS", "2"))
model.train(
    epochs,
    data,
    callbacks=[LossMonitor(), ckpt, resume],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)  # mscon_resume
print("training finished")
