"""Networks for the mscon trainer, written with mindspore.nn.

MindSpore is imported on first use (``build_model``), so ``train.py --help`` stays fast. Every
weight comes from MindSpore's initializers, which draw from numpy's global RNG that
``mindspore.set_seed`` seeds: the same seed gives identical initial weights on every rank, as long
as nothing calls ``np.random.*`` differently per rank in between (trainer/data.py only uses its
own ``np.random.default_rng`` generators, which leave the global RNG alone).
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspore import nn

MODELS = ("mlp", "lenet", "resnet18", "resnet50")
MLP_FEATURES = 32
MLP_HIDDEN = 64
LENET_SIZE = 32
# Small images keep CPU tests fast; the ResNets also take 224x224 (global average pooling).
DEFAULT_SHAPES: dict[str, tuple[int, ...]] = {
    "mlp": (MLP_FEATURES,),
    "lenet": (1, LENET_SIZE, LENET_SIZE),
    "resnet18": (3, 32, 32),
    "resnet50": (3, 32, 32),
}
RESNET_MIN_SIZE = 32  # five stride-2 stages: 32x32 reaches layer4 as 1x1


def input_shape(name: str, dataset_shape: tuple[int, ...] | None) -> tuple[int, ...]:
    """The per-sample input shape `name` is fed: the synthetic default, or the dataset's own
    shape checked against what the network can take (ValueError, one line, if it cannot)."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; valid: {', '.join(MODELS)}")
    if dataset_shape is None:
        return DEFAULT_SHAPES[name]
    shape = tuple(int(s) for s in dataset_shape)
    if name == "mlp":
        return shape  # flattened: features = prod(shape)
    if len(shape) != 3:
        raise ValueError(f"{name} needs C x H x W samples, the dataset gives {shape}")
    if name == "lenet" and shape[1:] != (LENET_SIZE, LENET_SIZE):
        raise ValueError(f"lenet needs C x 32 x 32 samples (its Dense layer is sized for it), got {shape}")
    if name.startswith("resnet") and min(shape[1:]) < RESNET_MIN_SIZE:
        raise ValueError(f"{name} needs images of at least 32x32, got {shape}")
    return shape


def build_model(name: str, num_classes: int, in_channels: int = 3, features: int | None = None) -> nn.Cell:
    """A fresh network; call ``mindspore.set_seed`` first for rank-identical initial weights.

    mlp: flat inputs of `features` (default 32; image samples are flattened, so pass prod(shape)).
    lenet: in_channels x 32 x 32. resnet18 / resnet50: in_channels x H x W, H, W >= 32.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; valid: {', '.join(MODELS)}")
    if num_classes < 1 or in_channels < 1:
        raise ValueError(f"num_classes and in_channels must be >= 1, got {num_classes}, {in_channels}")
    nets = _nets()
    if name == "mlp":
        return nets.MLP(features or MLP_FEATURES, num_classes)
    if name == "lenet":
        return nets.LeNet5(num_classes, in_channels)
    if name == "resnet18":
        return nets.ResNet(nets.BasicBlock, (2, 2, 2, 2), num_classes, in_channels)
    return nets.ResNet(nets.Bottleneck, (3, 4, 6, 3), num_classes, in_channels)


def count_params(net: nn.Cell) -> int:
    """Trainable parameters (weights, biases, BatchNorm gamma/beta; not the moving statistics)."""
    return sum(math.prod(p.shape) for p in net.trainable_params())


@functools.cache
def _nets() -> SimpleNamespace:
    """The Cell classes, defined on first use so that importing this module needs no MindSpore.

    construct() bodies only touch self.* cells and tensor methods (no free names), which is what
    GRAPH_MODE's source parser handles for classes defined inside a function."""
    from mindspore import nn
    from mindspore.common.initializer import HeNormal

    def conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Conv2d:
        # torchvision's layout (padding k // 2, no bias before BN) and its Kaiming fan-out init,
        # so parameter counts match the reference ResNets exactly.
        return nn.Conv2d(
            cin,
            cout,
            k,
            stride=stride,
            pad_mode="pad",
            padding=k // 2,
            has_bias=False,
            weight_init=HeNormal(mode="fan_out", nonlinearity="relu"),
        )

    class MLP(nn.Cell):
        """Dense-ReLU-Dense, hidden 64: seed 004's SimpleNet (Ascend 910 data-parallel guide, fed by
        a sharded GeneratorDataset of 32 random features). The smoke-test network."""

        def __init__(self, features: int, num_classes: int) -> None:
            super().__init__()
            self.flatten = nn.Flatten()
            self.fc1 = nn.Dense(features, MLP_HIDDEN)
            self.relu = nn.ReLU()
            self.fc2 = nn.Dense(MLP_HIDDEN, num_classes)

        def construct(self, x):  # untyped: MindSpore parses this source
            return self.fc2(self.relu(self.fc1(self.flatten(x))))

    class LeNet5(nn.Cell):
        """LeNet-5 on C x 32 x 32: MindSpore's own MNIST quick-start network. None of the seed
        write-ups trains it; it is the cheapest conv net for real MNIST (MnistSource) runs."""

        def __init__(self, num_classes: int, in_channels: int) -> None:
            super().__init__()
            self.features = nn.SequentialCell(
                nn.Conv2d(in_channels, 6, 5, pad_mode="valid"),
                nn.ReLU(),
                nn.MaxPool2d(2, 2),
                nn.Conv2d(6, 16, 5, pad_mode="valid"),
                nn.ReLU(),
                nn.MaxPool2d(2, 2),
                nn.Flatten(),
            )
            self.head = nn.SequentialCell(
                nn.Dense(16 * 5 * 5, 120),
                nn.ReLU(),
                nn.Dense(120, 84),
                nn.ReLU(),
                nn.Dense(84, num_classes),
            )

        def construct(self, x):
            return self.head(self.features(x))

    class BasicBlock(nn.Cell):
        """Two 3x3 convs (ResNet-18/34)."""

        expansion = 1

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            self.body = nn.SequentialCell(
                conv(cin, width, 3, stride),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                conv(width, width, 3),
                nn.BatchNorm2d(width),
            )
            self.shortcut = _shortcut(cin, width, stride)
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.relu(self.body(x) + self.shortcut(x))

    class Bottleneck(nn.Cell):
        """1x1 reduce, 3x3 (carrying the stride, as torchvision's "v1.5"), 1x1 expand x4 (ResNet-50+)."""

        expansion = 4

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * self.expansion
            self.body = nn.SequentialCell(
                conv(cin, width, 1),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                conv(width, width, 3, stride),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                conv(width, cout, 1),
                nn.BatchNorm2d(cout),
            )
            self.shortcut = _shortcut(cin, cout, stride)
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.relu(self.body(x) + self.shortcut(x))

    def _shortcut(cin: int, cout: int, stride: int) -> nn.Cell:
        if stride == 1 and cin == cout:
            return nn.Identity()
        return nn.SequentialCell(conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    class ResNet(nn.Cell):
        """The real ResNet (He et al. 2015, torchvision layout): 7x7/2 stem, BN, ReLU, 3x3/2 max
        pool, four stages (64..512 wide), global average pooling, Dense head.

        ResNet-50 is what seed 000 (8xA100, ResNet-50/152, uneven ImageNet shards) and seed 001
        (Ascend data/auto parallel) train; seed 001's listing calls a BasicBlock [3,4,6,3] net
        "ResNet50", this is the Bottleneck one (25,557,032 parameters at 1000 classes). ResNet-18
        (11,689,512) is the same family at CPU-friendly cost."""

        def __init__(self, block: type, layers: tuple[int, ...], num_classes: int, in_channels: int) -> None:
            super().__init__()
            self.stem = nn.SequentialCell(
                conv(in_channels, 64, 7, 2),
                nn.BatchNorm2d(64),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, pad_mode="pad", padding=1),
            )
            stages = []
            cin = 64
            for i, blocks in enumerate(layers):
                width = 64 * 2**i
                for j in range(blocks):
                    stages.append(block(cin, width, 2 if i > 0 and j == 0 else 1))
                    cin = width * block.expansion
            self.stages = nn.SequentialCell(stages)
            self.fc = nn.Dense(cin, num_classes)

        def construct(self, x):
            x = self.stages(self.stem(x))
            return self.fc(x.mean(axis=(2, 3)))

    nets = SimpleNamespace(
        MLP=MLP, LeNet5=LeNet5, BasicBlock=BasicBlock, Bottleneck=Bottleneck, ResNet=ResNet
    )
    return nets


def __getattr__(name: str) -> type:
    """``from models import LeNet5`` works too: AMP O1 re-creates a network's classes from their
    source and imports the base classes by name from this module."""
    if name in {"MLP", "LeNet5", "BasicBlock", "Bottleneck", "ResNet"}:
        return getattr(_nets(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
