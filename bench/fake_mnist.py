"""A small MNIST-format data set (idx files) for the examples' scripts where MNIST is not at hand:
digits drawn as bars over noise, so a model learns something and the losses move.

    python bench/fake_mnist.py DIR [SAMPLES]
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray) -> None:
    """One idx file: 0, 0, the unsigned-byte type code, the rank, big-endian sizes, the bytes."""
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, array.ndim]))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def write_fake_mnist(folder: Path, samples: int, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, samples)
    images = (rng.random((samples, 28, 28)) * 80).astype(np.uint8)
    for i, label in enumerate(labels):
        images[i, 2 * label + 3 : 2 * label + 6, 4:24] = 255
    write_idx(folder / "train-images-idx3-ubyte", images)
    write_idx(folder / "train-labels-idx1-ubyte", labels)
    return folder


if __name__ == "__main__":
    write_fake_mnist(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2560)
