"""An ordinary MindSpore data-parallel script, written the way the MindSpore tutorials do it.

mscon must run it unmodified: nothing here knows about mscon (no MSCON_METRICS, plain LossMonitor).
"""

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import LossMonitor, Model

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")
init()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 16)).astype(np.float32)
y = (x @ rng.standard_normal((16, 4)).astype(np.float32)).argmax(axis=1).astype(np.int32)
data = ms.dataset.GeneratorDataset(
    list(zip(x, y, strict=True)), ["x", "y"], num_shards=get_group_size(), shard_id=get_rank(), shuffle=False
).batch(16)

net = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4))
loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
model = Model(net, loss_fn=loss, optimizer=nn.Momentum(net.trainable_params(), 0.1, 0.9))
model.train(2, data, callbacks=[LossMonitor()], dataset_sink_mode=False)
print("user script done")
