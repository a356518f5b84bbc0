"""What an exact resume of random augmentation costs: the skipped batches of the resumed epoch go
through the whole pipeline (``fast_recovery`` off), so each random transform draws what it drew in
the uninterrupted run; fast recovery skips them below ``map`` and draws nothing (not exact).

Prints, for a resume at the end of a long epoch, the seconds to the first batch both ways and
against one full pass of the epoch, and whether each way gives the uninterrupted run's batches::

    python bench/augment_replay.py [--samples 20000] [--size 32] [--batch 32]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _dataset(samples: int, size: int, batch: int):  # noqa: ANN202 - a MindSpore dataset
    import mindspore.dataset as ds

    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (samples, size, size, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, samples).astype(np.int32)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True)
    crop = ds.vision.RandomCrop(size, padding=4)
    data = data.map([crop, ds.vision.RandomHorizontalFlip(), ds.vision.HWC2CHW()], "image")
    return data.batch(batch, drop_remainder=True)


def _first_after(samples: int, size: int, batch: int, skip: int, fast: bool) -> tuple[float, np.ndarray]:
    import mindspore as ms
    from mindspore.dataset import config

    ms.set_seed(1)
    data = _dataset(samples, size, batch)
    config.set_fast_recovery(fast)
    t0 = time.perf_counter()
    data.set_init_step(skip)
    it = data.create_tuple_iterator(num_epochs=1, output_numpy=True)
    first = next(it)[0]
    return time.perf_counter() - t0, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    import mindspore as ms

    ms.set_seed(1)
    data = _dataset(a.samples, a.size, a.batch)
    batches = data.get_dataset_size()
    skip = batches - 1  # a resume at the epoch's last batch: the most to replay
    t0 = time.perf_counter()
    want = None
    for i, (image, _) in enumerate(data.create_tuple_iterator(num_epochs=1, output_numpy=True)):
        if i == skip:
            want = image
    full = time.perf_counter() - t0
    exact_s, exact = _first_after(a.samples, a.size, a.batch, skip, fast=False)
    fast_s, fast = _first_after(a.samples, a.size, a.batch, skip, fast=True)
    print(
        f"epoch: {a.samples} images {a.size}x{a.size}, batch {a.batch}: {batches} batches, "
        f"one pass {full:.2f} s"
    )
    print(
        f"resume at batch {skip}: exact replay (fast_recovery off) {exact_s:.2f} s to the first batch, "
        f"{exact_s / full:.2f}x a pass; same batch as uninterrupted: {bool(np.array_equal(exact, want))}"
    )
    print(
        f"                 fast recovery (MindSpore's default) {fast_s:.2f} s; "
        f"same batch as uninterrupted: {bool(np.array_equal(fast, want))}"
    )


if __name__ == "__main__":
    main()
