"""MindCV 0.3's ResNet-18 trained as MindCV's train.py builds it (configs/resnet/resnet_18_ascend.yaml:
cosine decay from lr 0.1 with a warm-up epoch, momentum 0.9, weight decay 1e-4, label smoothing 0.1, a
fixed loss scale of 1024, BatchNorm; create_model/create_loss/create_scheduler/create_optimizer/
create_trainer), data parallel, with mscon_resume's ResumeCallback: the model-zoo case of
bench/user_restart.py (``--model resnet18``). Synthetic images (seeded noise, no download).

Environment: ``SAMPLES`` per rank (default 256), ``BATCH`` (8), ``IMAGE`` (side, 32), ``EPOCHS`` (4).
Needs ``pip install mindcv==0.3.0`` (pyproject's ``bench-mindcv`` group).
"""

import os

import mindspore as ms
import numpy as np
from mindcv.loss import create_loss
from mindcv.models import create_model
from mindcv.optim import create_optimizer
from mindcv.scheduler import create_scheduler
from mindcv.utils import create_trainer
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import LossMonitor

import mscon_resume

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
init()
ms.set_seed(1)
rank, size = get_rank(), get_group_size()
samples = int(os.getenv("SAMPLES", "256"))
batch = int(os.getenv("BATCH", "8"))
side = int(os.getenv("IMAGE", "32"))
epochs = int(os.getenv("EPOCHS", "4"))

rng = np.random.default_rng(1000 + rank)  # each rank its own shard of the synthetic set
images = rng.random((samples, 3, side, side), dtype=np.float32)
labels = rng.integers(0, 10, samples).astype(np.int32)
data = ms.dataset.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False)
data = data.batch(batch, drop_remainder=True)
steps_per_epoch = data.get_dataset_size()

network = create_model("resnet18", num_classes=10, pretrained=False)
loss = create_loss(name="CE", label_smoothing=0.1)
lr = create_scheduler(
    steps_per_epoch,
    scheduler="cosine_decay",
    lr=0.1,
    min_lr=0.0,
    warmup_epochs=1,
    decay_epochs=max(1, epochs - 1),
    num_epochs=epochs,
)
optimizer = create_optimizer(
    network.trainable_params(), opt="momentum", lr=lr, weight_decay=1e-4, momentum=0.9, loss_scale=1024.0
)
model = create_trainer(
    network, loss, optimizer, metrics=None, amp_level="O0", amp_cast_list=None, loss_scale_type="fixed",
    loss_scale=1024.0,
)  # fmt: skip
resume = mscon_resume.ResumeCallback(data)
model.train(
    epochs,
    data,
    callbacks=[LossMonitor(), resume],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)
print("training finished", flush=True)
