"""Data sources and rank sharding for the mscon trainer.

Sources are random-access numpy objects (``labels``, ``num_classes``, ``sample_shape``, ``len``,
``[i] -> (x float32, y int32)``). ``shard_indices`` is pure numpy so the sharding rules can be
tested without MindSpore; ``make_dataset`` is the only function that imports MindSpore.

Seed 000 (8xA100 ResNet-50/152 on ImageNet) saw some cards 30% slower because each shard's class
mix differed; ``SyntheticSource(imbalance=...)`` reproduces a skewed label set and
``shard_indices(stratified=True)`` is the fix (every shard gets the global class proportions).
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import mindspore.dataset as msds

SOURCES = ("synthetic", "mnist", "imagefolder")
SAMPLERS = ("even", "stratified")
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
# torchvision/ImageNet statistics: what ResNet recipes (seed 001's transform included) normalise with.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
MNIST_SIZE = 32  # LeNet-5's input; MNIST's 28x28 is padded by 2 pixels on each side


class Source(Protocol):
    labels: np.ndarray
    num_classes: int
    sample_shape: tuple[int, ...]

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]: ...


def _check_index(i: int, n: int) -> int:
    i = int(i)
    if not -n <= i < n:
        raise IndexError(f"sample {i} out of range for {n} samples")
    return i % n


def _grid_map(size: int, cells: int) -> np.ndarray:
    """Nearest-neighbour map from `size` output pixels to `cells` low-resolution cells."""
    return (np.arange(size) * cells) // size


def zipf_probs(num_classes: int, exponent: float) -> np.ndarray:
    """Class frequencies p_k ~ 1 / (k + 1) ** exponent; exponent 0 is uniform."""
    p = (np.arange(num_classes) + 1.0) ** -float(exponent)
    return p / p.sum()


def _calibrate_bias(logits: np.ndarray, target: np.ndarray, iters: int = 1000) -> np.ndarray:
    """Per-class logit offsets so that argmax(logits + b) hits the target class frequencies.

    The teacher stays an (affine) linear function of the features, so the task stays learnable;
    with 10 classes a few dozen cheap argmax passes over (n, C) hit the target to a sample or two."""
    n, c = logits.shape
    b = np.zeros(c, np.float64)
    step = 0.2 * float(logits.std() or 1.0)
    best, best_err, best_it = b.copy(), np.inf, 0
    buf = np.empty_like(logits)  # reused: a fresh (n, C) temporary per pass dominates the run time
    for it in range(iters):
        freq = np.bincount(np.argmax(np.add(logits, b, out=buf), axis=1), minlength=c) / n
        err = float(np.abs(freq - target).sum())
        if err < best_err:
            best, best_err, best_it = b.copy(), err, it
        if err * n < 1 or it - best_it > 50:  # exact, or no longer improving
            break
        # Damped multiplicative update; a floor keeps empty classes from sending log() to -inf.
        b += step / (1 + it / 100) * (np.log(target) - np.log(np.maximum(freq, 0.5 / n)))
    return best


class SyntheticSource:
    """A learnable synthetic task; the same (n, shape, num_classes, seed) gives identical data on
    every rank, without touching numpy's global RNG (which ``mindspore.set_seed`` owns for weights).

    Flat shapes (the MLP): x ~ N(0, 1) and y = argmax(x @ W + b) for a fixed random teacher W.
    Image shapes (C, H, W): a low-resolution latent z (C x 8 x 8 at most) carries the teacher's
    signal; x = upsample(z + pattern[y]) + texture, where pattern is a per-class blob (a linear
    teacher on raw noise is too hard to learn in a few steps) and texture is full-resolution noise
    from a small fixed bank. Only z is stored, so 224x224 ImageNet-shaped data costs no more memory
    than 32x32. Class frequencies follow p_k ~ 1/(k+1)**imbalance (uniform at 0, Zipf-like skew above)
    through a calibrated per-class teacher bias; a skew reproduces seed 000's uneven shard mixes.
    Past ``DISTINCT`` samples the data repeats (sample i is sample i % DISTINCT): a long synthetic
    epoch (100,000 steps x 32) built 3.2 M samples, 9 s and 410 MB on every rank before its first step.
    """

    GRID = 8  # latent / pattern resolution for images
    TEXTURES = 64  # full-resolution noise images shared by all samples
    DISTINCT = 65536  # samples made; more than a short job passes over, 0.2 s to make

    def __init__(
        self,
        n: int,
        shape: Sequence[int],
        num_classes: int = 10,
        seed: int = 1,
        imbalance: float = 0.0,
    ) -> None:
        shape = tuple(int(s) for s in shape)
        if n < 1:
            raise ValueError(f"synthetic data needs at least 1 sample, got {n}")
        if num_classes < 2:
            raise ValueError(f"synthetic data needs at least 2 classes, got {num_classes}")
        if len(shape) not in (1, 3) or min(shape) < 1:
            raise ValueError(f"synthetic sample shape must be (features,) or (C, H, W), got {shape}")
        if imbalance < 0:
            raise ValueError(f"imbalance must be >= 0, got {imbalance}")
        self.sample_shape = shape
        self.num_classes = int(num_classes)
        rng = np.random.default_rng(seed)
        total, n = n, min(n, self.DISTINCT)
        if len(shape) == 1:
            latent_shape: tuple[int, ...] = shape
        else:
            c, h, w = shape
            latent_shape = (c, min(h, self.GRID), min(w, self.GRID))
        self.latent = rng.standard_normal((n, *latent_shape), dtype=np.float32)
        teacher = rng.standard_normal((math.prod(latent_shape), num_classes), dtype=np.float32)
        # float64: BLAS rounding differs between CPUs, and a label flipped on one rank would make
        # stratified shards (computed from labels on every rank) overlap; in float64 such a flip
        # needs a near-tie within ~1e-13, which is vanishingly unlikely.
        logits = self.latent.reshape(n, -1).astype(np.float64) @ teacher.astype(np.float64)
        # Calibrated even at imbalance 0: a raw random teacher is itself up to 2x uneven across classes.
        logits = logits + _calibrate_bias(logits, zipf_probs(num_classes, imbalance))
        self.labels = np.resize(np.argmax(logits, axis=1).astype(np.int32), total)  # repeated past n
        self.patterns: np.ndarray | None = None
        if len(shape) == 3:
            self.patterns = rng.standard_normal((num_classes, *latent_shape), dtype=np.float32)
            self.textures = rng.standard_normal((min(n, self.TEXTURES), *shape), dtype=np.float32)
            self._rows = _grid_map(shape[1], latent_shape[1])
            self._cols = _grid_map(shape[2], latent_shape[2])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        i = _check_index(i, len(self))
        y = self.labels[i]
        j = i % len(self.latent)  # the sample it repeats
        if self.patterns is None:
            return self.latent[j], y
        low = self.latent[j] + self.patterns[y]
        x = low[:, self._rows][:, :, self._cols] + self.textures[j % len(self.textures)]
        return x, y


def _read_idx(path: Path) -> np.ndarray:
    """One idx file (the MNIST container: 0, 0, dtype code, ndim, big-endian uint32 dims, data)."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"cannot read {path}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte idx file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated idx header")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    if len(raw) - header != math.prod(dims):
        raise ValueError(f"{path}: header says {dims} = {math.prod(dims)} bytes, has {len(raw) - header}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def _find_idx(root: Path, split: str, kind: str, ndim: int) -> Path:
    # Both the canonical names and the dotted variant some mirrors ship, raw or gzipped.
    for stem in (f"{split}-{kind}-idx{ndim}-ubyte", f"{split}-{kind}.idx{ndim}-ubyte"):
        for name in (stem, stem + ".gz"):
            if (root / name).is_file():
                return root / name
    raise ValueError(f"MNIST directory {root} has no {split}-{kind}-idx{ndim}-ubyte[.gz]")


class MnistSource:
    """MNIST from its idx files (``train-*`` or ``t10k-*``, raw or ``.gz``) for LeNet-5: float32
    in [0, 1], 1 x 32 x 32 (28x28 padded by 2 pixels per side; other sizes are padded or
    nearest-resized to 32). Kept as uint8 in memory and scaled per sample (4x less memory)."""

    def __init__(self, path: str | Path, split: str = "train") -> None:
        root = Path(path)
        if not root.is_dir():
            raise ValueError(f"MNIST path {root} is not a directory")
        images = _read_idx(_find_idx(root, split, "images", 3))
        labels = _read_idx(_find_idx(root, split, "labels", 1))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels) or len(labels) == 0:
            raise ValueError(f"MNIST files in {root} disagree: images {images.shape}, labels {labels.shape}")
        self.images = _to_square(images, MNIST_SIZE)[:, None]  # (n, 1, 32, 32) uint8
        self.labels = labels.astype(np.int32)
        self.num_classes = max(10, int(self.labels.max()) + 1)
        self.sample_shape = (1, MNIST_SIZE, MNIST_SIZE)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        i = _check_index(i, len(self))
        return self.images[i].astype(np.float32) / np.float32(255.0), self.labels[i]


def _to_square(images: np.ndarray, size: int) -> np.ndarray:
    """(n, h, w) -> (n, size, size): centred zero padding where smaller, nearest resize where larger."""
    n, h, w = images.shape
    if h > size or w > size:
        images = images[:, _grid_map(min(h, size), h)][:, :, _grid_map(min(w, size), w)]
        n, h, w = images.shape
    top, left = (size - h) // 2, (size - w) // 2
    return np.pad(images, ((0, 0), (top, size - h - top), (left, size - w - left)))


class ImageFolderSource:
    """``root/<class>/<image>`` decoded with Pillow per sample (ImageNet does not fit in memory):
    RGB, resized to image_size, CHW float32 normalised with the ImageNet mean/std. Classes are the
    sorted subfolder names (so every rank and every run agrees on the label ids)."""

    def __init__(self, path: str | Path, image_size: int | Sequence[int] = 224) -> None:
        try:
            from PIL import Image  # noqa: F401  (Pillow ships as a MindSpore dependency)
        except ImportError as e:
            raise ValueError(f"imagefolder data needs Pillow ({e}); install it: pip install pillow") from None
        root = Path(path)
        if not root.is_dir():
            raise ValueError(f"image folder {root} is not a directory")
        h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if h < 1 or w < 1:
            raise ValueError(f"image size must be positive, got {image_size}")
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        files: list[Path] = []
        labels: list[int] = []
        for k, name in enumerate(self.classes):
            found = sorted(
                p for p in (root / name).rglob("*") if p.suffix.lower() in IMAGE_EXTS and p.is_file()
            )
            files += found
            labels += [k] * len(found)
        if not files:
            raise ValueError(f"image folder {root} has no images in class subfolders (root/<class>/<image>)")
        self.files = files
        self.labels = np.array(labels, np.int32)
        self.num_classes = len(self.classes)
        self.sample_shape = (3, int(h), int(w))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        from PIL import Image

        i = _check_index(i, len(self))
        _, h, w = self.sample_shape
        try:
            with Image.open(self.files[i]) as im:
                rgb = im.convert("RGB").resize((w, h), Image.Resampling.BILINEAR)
        except OSError as e:
            raise ValueError(f"cannot decode {self.files[i]}: {e}") from None
        x = (np.asarray(rgb, np.float32) / np.float32(255.0) - IMAGENET_MEAN) / IMAGENET_STD
        return np.ascontiguousarray(x.transpose(2, 0, 1)), self.labels[i]


class SubsetSource:
    """A fixed subset of another source (same for every rank: the indices come from the seed)."""

    def __init__(self, base: Source, indices: np.ndarray) -> None:
        self.base = base
        self.indices = np.asarray(indices, np.int64)
        self.labels = base.labels[self.indices]
        self.num_classes = base.num_classes
        self.sample_shape = base.sample_shape

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.base[int(self.indices[_check_index(i, len(self))])]


def make_source(
    kind: str,
    path: str | Path | None,
    sample_shape: Sequence[int] | None,
    num_samples: int | None,
    num_classes: int | None,
    seed: int,
    imbalance: float = 0.0,
) -> Source:
    """Build the source train.py asked for; every problem with the arguments is a one-line ValueError.

    synthetic: needs sample_shape, num_samples, num_classes; path is ignored.
    mnist / imagefolder: need path; num_classes comes from the data (the argument is ignored);
    sample_shape[-2:] is the image size for imagefolder (224x224 when None); num_samples, when
    given, takes a seeded random subset of that size (identical on every rank); imbalance must be 0.
    """
    if kind == "synthetic":
        if sample_shape is None or not num_samples or not num_classes:
            raise ValueError("synthetic data needs a sample shape, a sample count and a class count")
        return SyntheticSource(num_samples, sample_shape, num_classes, seed, imbalance)
    if kind not in SOURCES:
        raise ValueError(f"unknown dataset '{kind}'; valid: {', '.join(SOURCES)}")
    if imbalance:
        raise ValueError(f"imbalance only applies to synthetic data, not {kind}")
    if path is None or str(path) == "":
        raise ValueError(f"dataset {kind} needs a data path")
    if not Path(path).exists():
        raise ValueError(f"{kind} data path {path} does not exist")
    source: Source
    if kind == "mnist":
        source = MnistSource(path)
    else:
        size = tuple(sample_shape[-2:]) if sample_shape and len(sample_shape) >= 2 else 224
        source = ImageFolderSource(path, size)
    if num_samples:
        if num_samples > len(source):
            raise ValueError(f"asked for {num_samples} samples but {kind} data at {path} has {len(source)}")
        if num_samples < len(source):
            pick = np.random.default_rng(seed).choice(len(source), num_samples, replace=False)
            source = SubsetSource(source, np.sort(pick))
    return source


def shard_indices(
    labels: np.ndarray,
    num_shards: int,
    shard_id: int,
    epoch: int,
    seed: int,
    stratified: bool,
) -> np.ndarray:
    """This shard's sample indices for one epoch (int64), the same computation on every rank.

    A global permutation from (seed, epoch) drops ``len % num_shards`` random samples (so every
    shard has exactly ``len // num_shards``, like drop_remainder, without always dropping the same
    tail), then:
    - plain: shard k takes every num_shards-th sample of the permutation;
    - stratified: the kept samples are grouped by class (class order shuffled too, so no class is
      systematically the one split unevenly) and dealt round-robin, so each shard's count of every
      class is within 1 of every other shard's; each shard is then shuffled with one permutation
      shared by all shards, so at step s every rank also sees about the same class mix.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id {shard_id} is not in [0, {num_shards})")
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed {seed}, epoch {epoch}")
    n = len(labels)
    per_shard = n // num_shards
    rng = np.random.default_rng((seed, epoch))
    kept = rng.permutation(n)[: per_shard * num_shards]
    if not stratified:
        return kept[shard_id::num_shards]
    classes, inverse = np.unique(labels[kept], return_inverse=True)
    class_rank = rng.permutation(len(classes))
    # Stable sort keeps each class's samples in (random) permutation order.
    grouped = kept[np.argsort(class_rank[inverse], kind="stable")]
    return grouped[shard_id::num_shards][rng.permutation(per_shard)]


def _epoch_sampler(
    labels: np.ndarray, num_shards: int, shard_id: int, epoch: int, seed: int, stratified: bool
) -> msds.Sampler:
    """A MindSpore Sampler yielding shard_indices(...) for epoch, epoch + 1, ... on each pass.

    MindSpore 2.10 calls __iter__ once per epoch and reset() between epochs (verified with
    create_tuple_iterator(num_epochs=N) and Model.train(N, ...)); defining __len__ stops it from
    deep-copying the sampler and iterating it once just to count samples. A plain index list
    (SubsetSampler) would replay one fixed order every epoch."""
    import mindspore.dataset as ds

    class ShardSampler(ds.Sampler):
        def __init__(self) -> None:
            self.epoch = epoch
            self.size = n_shard
            super().__init__()

        def __iter__(self) -> Any:
            idx = shard_indices(labels, num_shards, shard_id, self.epoch, seed, stratified)
            return iter(idx.tolist())

        def reset(self) -> None:
            self.epoch += 1

        def __len__(self) -> int:
            return self.size

    n_shard = len(labels) // num_shards
    return ShardSampler()


def make_dataset(
    source: Source,
    per_rank_batch: int,
    num_shards: int,
    shard_id: int,
    epoch: int = 0,
    seed: int = 1,
    sampler: str = "even",
    num_workers: int = 1,
) -> msds.Dataset:
    """This rank's batched GeneratorDataset (columns "x", "y"; drop_remainder=True).

    Both samplers go through shard_indices (even: plain, stratified: per-class round-robin) via a
    Sampler that moves to the next epoch's permutation on every pass, starting at `epoch`.
    GeneratorDataset's own num_shards/shard_id is NOT used: in MindSpore 2.10 it pads every shard
    to ceil(n / num_shards) by wrapping around, so when n % num_shards != 0 some samples land on
    two ranks, and it shuffles with mindspore.dataset's global seed rather than `seed`.
    """
    import mindspore.dataset as ds

    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler '{sampler}'; valid: {', '.join(SAMPLERS)}")
    if per_rank_batch < 1:
        raise ValueError(f"per-rank batch must be >= 1, got {per_rank_batch}")
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id {shard_id} is not in [0, {num_shards})")
    per_shard = len(source) // num_shards
    if per_shard < per_rank_batch:
        raise ValueError(
            f"{len(source)} samples over {num_shards} ranks is {per_shard} per rank, "
            f"less than one batch of {per_rank_batch}"
        )
    smp = _epoch_sampler(source.labels, num_shards, shard_id, epoch, seed, sampler == "stratified")
    # python_multiprocessing only matters with >1 worker; processes avoid the GIL for PIL decoding.
    dset = ds.GeneratorDataset(
        source,
        ["x", "y"],
        sampler=smp,
        num_parallel_workers=num_workers,
        python_multiprocessing=num_workers > 1,
    )
    return dset.batch(per_rank_batch, drop_remainder=True)
