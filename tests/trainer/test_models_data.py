"""trainer/models.py and trainer/data.py: real architectures, seeded weights, sources, sharding."""

from __future__ import annotations

import gzip
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from trainer import data, models  # noqa: E402


@pytest.fixture
def ms() -> Any:
    """MindSpore for the tests that need it; the numpy-only ones (sharding, sources) run without."""
    return pytest.importorskip(
        "mindspore", reason="MindSpore is not installed; install with: pip install '.[train]'"
    )


# ---------------------------------------------------------------- models


def test_importing_the_modules_does_not_import_mindspore() -> None:
    # train.py imports both at the top; --help must not pay for `import mindspore`.
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from trainer import models, data; "
        "print('mindspore' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("name", "expected"), [("resnet18", 11_689_512), ("resnet50", 25_557_032)])
def test_resnet_parameter_counts_match_the_reference(name: str, expected: int, ms: Any) -> None:
    net = models.build_model(name, num_classes=1000, in_channels=3)
    assert models.count_params(net) == expected
    # BatchNorm moving statistics exist but are not trainable.
    assert any("moving_mean" in p.name for p in net.get_parameters())


@pytest.mark.parametrize("name", models.MODELS)
def test_forward_pass_gives_batch_by_classes(name: str, ms: Any) -> None:
    shape = models.input_shape(name, None)
    net = models.build_model(name, num_classes=7, in_channels=shape[0], features=math.prod(shape))
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, *shape), dtype=np.float32))
    assert net(x).shape == (2, 7)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnets_take_imagenet_sized_inputs(name: str, ms: Any) -> None:
    net = models.build_model(name, num_classes=1000)
    out = net(ms.Tensor(np.zeros((1, 3, 224, 224), np.float32)))
    assert out.shape == (1, 1000)


def test_resnet18_trains_in_graph_mode_with_batchnorm(ms: Any) -> None:
    # train.py runs GRAPH_MODE; BatchNorm in training mode must compile and update on CPU.
    from mindspore import nn

    src = data.SyntheticSource(16, (3, 32, 32), 10, seed=1)
    dset = data.make_dataset(src, per_rank_batch=4, num_shards=1, shard_id=0, epoch=0, seed=1, sampler="even")
    ms.set_seed(1)
    net = models.build_model("resnet18", 10)
    before = net.stem[1].moving_mean.asnumpy().copy()
    losses: list[float] = []

    class Record(ms.train.Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms.Model(net, loss, nn.Momentum(net.trainable_params(), learning_rate=0.005, momentum=0.9))
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        model.train(1, dset, callbacks=[Record()], dataset_sink_mode=False)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert not np.array_equal(before, net.stem[1].moving_mean.asnumpy())


@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet18"])
def test_same_seed_gives_identical_initial_weights(name: str, ms: Any) -> None:
    def weights(seed: int) -> dict[str, np.ndarray]:
        ms.set_seed(seed)
        net = models.build_model(name, 10, in_channels=models.input_shape(name, None)[0])
        return {p.name: p.asnumpy() for p in net.get_parameters()}

    a, b, c = weights(7), weights(7), weights(8)
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # Not vacuous: another seed changes the randomly initialised tensors.
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_input_shape_defaults_and_checks() -> None:
    assert models.input_shape("mlp", None) == (32,)
    assert models.input_shape("lenet", None) == (1, 32, 32)
    assert models.input_shape("resnet18", None) == (3, 32, 32)
    assert models.input_shape("resnet50", (3, 224, 224)) == (3, 224, 224)
    assert models.input_shape("lenet", (1, 32, 32)) == (1, 32, 32)
    assert models.input_shape("mlp", (1, 32, 32)) == (1, 32, 32)
    with pytest.raises(ValueError, match="lenet needs C x 32 x 32"):
        models.input_shape("lenet", (3, 224, 224))
    with pytest.raises(ValueError, match="at least 32x32"):
        models.input_shape("resnet18", (3, 16, 16))
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        models.input_shape("vgg", None)
    with pytest.raises(ValueError, match="unknown model"):
        models.build_model("vgg", 10)


# ---------------------------------------------------------------- shard_indices


def shards(
    labels: np.ndarray, n_shards: int, epoch: int = 0, seed: int = 1, stratified: bool = False
) -> list:
    return [data.shard_indices(labels, n_shards, r, epoch, seed, stratified) for r in range(n_shards)]


@pytest.mark.parametrize("stratified", [False, True])
def test_shards_are_equal_disjoint_and_cover_the_truncated_set(stratified: bool) -> None:
    labels = data.SyntheticSource(1003, (8,), 10, seed=3, imbalance=1.0).labels
    parts = shards(labels, 8, stratified=stratified)
    assert [len(p) for p in parts] == [1003 // 8] * 8
    union = np.concatenate(parts)
    assert len(np.unique(union)) == len(union) == 1000  # disjoint; 3 remainder samples dropped
    assert union.min() >= 0 and union.max() < 1003
    # Deterministic per (seed, epoch): what every rank computes independently.
    again = shards(labels, 8, stratified=stratified)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    assert not np.array_equal(parts[0], shards(labels, 8, epoch=1, stratified=stratified)[0])
    assert not np.array_equal(parts[0], shards(labels, 8, seed=2, stratified=stratified)[0])
    # The dropped remainder is random per epoch, not always the same tail.
    dropped = [set(range(1003)) - set(np.concatenate(shards(labels, 8, epoch=e)).tolist()) for e in range(4)]
    assert len({frozenset(d) for d in dropped}) > 1


def test_stratified_shards_keep_global_class_proportions_plain_ones_do_not() -> None:
    # Seed 000's problem: a Zipf-skewed label set split 8 ways.
    labels = data.SyntheticSource(2000, (8,), 10, seed=5, imbalance=1.5).labels
    global_counts = np.bincount(labels, minlength=10)
    assert global_counts[0] > 8 * global_counts[-1]  # really imbalanced
    worst_plain = 0.0
    for seed in range(3):
        for stratified in (False, True):
            counts = np.stack(
                [np.bincount(labels[p], minlength=10) for p in shards(labels, 8, 0, seed, stratified)]
            )
            # Expected count per shard and class, from the global proportions.
            deviation = np.abs(counts - global_counts * (2000 // 8) / 2000).max()
            if stratified:
                assert deviation <= 1.0 + 1e-9
                assert (counts.max(axis=0) - counts.min(axis=0)).max() <= 1
            else:
                worst_plain = max(worst_plain, deviation)
    assert worst_plain > 3  # a plain random split is several samples per class off


def test_stratified_steps_see_similar_class_mix_on_every_shard() -> None:
    labels = np.repeat(np.arange(4), [40, 30, 20, 10]).astype(np.int32)
    parts = shards(labels, 2, stratified=True)
    # Same within-shard permutation on every shard: step s pairs same-class-region samples.
    same = np.mean(labels[parts[0]] == labels[parts[1]])
    assert same > 0.8


def test_shard_indices_edges() -> None:
    labels = np.zeros(5, np.int32)
    assert sorted(data.shard_indices(labels, 1, 0, 0, 0, False).tolist()) == [0, 1, 2, 3, 4]
    assert [len(p) for p in shards(labels, 8)] == [0] * 8
    with pytest.raises(ValueError, match="shard_id 2 is not in"):
        data.shard_indices(labels, 2, 2, 0, 0, False)
    with pytest.raises(ValueError, match="seed and epoch"):
        data.shard_indices(labels, 2, 0, -1, 0, True)


# ---------------------------------------------------------------- sources


@pytest.mark.parametrize("shape", [(32,), (1, 32, 32)], ids=["flat", "image"])
def test_a_long_synthetic_epoch_repeats_its_samples_instead_of_making_them_all(
    shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """100,000 steps x 32 made 3.2 M samples (9 s, 410 MB a rank); past DISTINCT they repeat."""
    monkeypatch.setattr(data.SyntheticSource, "DISTINCT", 500)
    long = data.SyntheticSource(1800, shape, 10, seed=2)
    short = data.SyntheticSource(500, shape, 10, seed=2)
    assert len(long) == 1800 and len(long.labels) == 1800 and len(long.latent) == 500
    for i in (0, 499, 500, 1234, 1799, -1):
        x, y = long[i]
        want_x, want_y = short[i % 1800 % 500]
        assert np.array_equal(x, want_x) and y == want_y, i
    assert np.array_equal(long.labels[:500], short.labels) and np.array_equal(
        long.labels[1000:1500], short.labels
    )
    shard = data.shard_indices(long.labels, 4, 1, 0, 2, True)  # sharding sees every index
    assert len(shard) == 450 and shard.max() < 1800


def test_synthetic_source_is_deterministic_learnable_and_shaped() -> None:
    a = data.SyntheticSource(300, (1, 32, 32), 10, seed=4)
    b = data.SyntheticSource(300, (1, 32, 32), 10, seed=4)
    c = data.SyntheticSource(300, (1, 32, 32), 10, seed=5)
    x, y = a[17]
    assert x.shape == (1, 32, 32) and x.dtype == np.float32 and y.dtype == np.int32
    assert np.array_equal(x, b[17][0]) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(x, c[17][0])
    assert (
        a.labels.dtype == np.int32 and len(a) == 300 and a.num_classes == 10 and a.sample_shape == (1, 32, 32)
    )
    assert len(np.unique(a.labels)) == 10
    # Learnable: a least-squares linear read-out already separates held-out samples.
    xs = np.stack([a[i][0].ravel() for i in range(300)])
    xs = np.c_[xs, np.ones(300)]
    w = np.linalg.lstsq(xs[:200], np.eye(10)[a.labels[:200]], rcond=None)[0]
    assert np.mean(np.argmax(xs[200:] @ w, axis=1) == a.labels[200:]) > 0.5
    big = data.SyntheticSource(4, (3, 224, 224), 1000, seed=1)
    assert big[3][0].shape == (3, 224, 224)
    with pytest.raises(IndexError):
        a[300]


def test_synthetic_imbalance_is_zipf_like() -> None:
    src = data.SyntheticSource(2000, (32,), 10, seed=1, imbalance=1.0)
    counts = np.bincount(src.labels, minlength=10)
    target = data.zipf_probs(10, 1.0) * 2000
    assert np.abs(counts - target).max() <= 10
    flat = np.bincount(data.SyntheticSource(2000, (32,), 10, seed=1).labels, minlength=10)
    assert np.abs(flat - 200).max() <= 3  # imbalance 0: calibrated to uniform


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    blob = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(blob))
    else:
        path.write_bytes(blob)


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files_raw_and_gz(tmp_path: Path, compress: bool) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5, 9], np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte", images, compress)
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels, compress)
    src = data.make_source("mnist", tmp_path, None, None, None, seed=1)
    assert len(src) == 6 and src.sample_shape == (1, 32, 32) and src.num_classes == 10
    assert src.labels.dtype == np.int32 and src.labels.tolist() == labels.tolist()
    x, y = src[2]
    assert x.shape == (1, 32, 32) and x.dtype == np.float32 and int(y) == 4
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert np.array_equal(x[0, 2:30, 2:30], images[2] / np.float32(255.0))  # 2-pixel padding
    assert not x[0, :2].any() and not x[0, :, 30:].any()
    sub = data.make_source("mnist", tmp_path, None, 4, None, seed=1)
    assert len(sub) == 4 and len(set(sub.labels.tolist()) - set(labels.tolist())) == 0


def test_mnist_errors_are_one_line_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        data.make_source("mnist", tmp_path / "nope", None, None, None, seed=1)
    with pytest.raises(ValueError, match="needs a data path"):
        data.make_source("mnist", None, None, None, None, seed=1)
    with pytest.raises(ValueError, match=r"no train-images-idx3-ubyte\[\.gz\]"):
        data.make_source("mnist", tmp_path, None, None, None, seed=1)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x0d\x03garbage")
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(2, np.uint8), False)
    with pytest.raises(ValueError, match="bad magic") as err:
        data.make_source("mnist", tmp_path, None, None, None, seed=1)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="unknown dataset 'cifar'"):
        data.make_source("cifar", tmp_path, None, None, None, seed=1)
    with pytest.raises(ValueError, match="synthetic data needs"):
        data.make_source("synthetic", None, None, 10, 10, seed=1)


def test_image_folder_with_tiny_pngs(tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image", reason="Pillow is not installed (it ships with MindSpore)")
    colours = {"cat": (255, 0, 0), "ant": (0, 0, 255)}  # sorted: ant = 0, cat = 1
    for name, rgb in colours.items():
        (tmp_path / name).mkdir()
        for k in range(2):
            image.new("RGB", (12, 10), rgb).save(tmp_path / name / f"{k}.png")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    src = data.make_source("imagefolder", tmp_path, (3, 16, 16), None, None, seed=1)
    assert src.classes == ["ant", "cat"] and src.num_classes == 2
    assert src.labels.tolist() == [0, 0, 1, 1] and src.sample_shape == (3, 16, 16)
    x, y = src[2]
    assert x.shape == (3, 16, 16) and x.dtype == np.float32 and int(y) == 1
    red = (1.0 - data.IMAGENET_MEAN[0]) / data.IMAGENET_STD[0]
    assert np.allclose(x[0], red, atol=1e-5) and np.allclose(
        x[1], -data.IMAGENET_MEAN[1] / data.IMAGENET_STD[1]
    )
    empty = tmp_path / "empty"
    (empty / "class").mkdir(parents=True)
    with pytest.raises(ValueError, match="has no images"):
        data.make_source("imagefolder", empty, None, None, None, seed=1)


# ---------------------------------------------------------------- make_dataset


class IndexSource:
    """x is the sample's own index, so a batch tells which samples a rank got."""

    def __init__(self, labels: np.ndarray) -> None:
        self.labels = labels.astype(np.int32)
        self.num_classes = int(labels.max()) + 1
        self.sample_shape = (1,)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return np.array([i], np.float32), self.labels[i]


@pytest.mark.parametrize("sampler", data.SAMPLERS)
def test_make_dataset_two_shards_cover_the_data_once_per_epoch(sampler: str, ms: Any) -> None:
    labels = np.repeat(np.arange(3), [11, 7, 3])  # 21 samples: not divisible by 2 shards
    src = IndexSource(labels)
    seen: dict[int, list[list[int]]] = {}
    for rank in range(2):
        dset = data.make_dataset(src, 2, 2, rank, epoch=3, seed=9, sampler=sampler)
        assert dset.get_dataset_size() == 5
        it = dset.create_dict_iterator(num_epochs=2, output_numpy=True)
        seen[rank] = []
        for _ in range(2):
            batches = [(b["x"][:, 0].astype(int), b["y"]) for b in it]
            assert all(x.shape == (2,) and y.dtype == np.int32 for x, y in batches)
            seen[rank].append(np.concatenate([x for x, _ in batches]).tolist())
    for e in range(2):
        r0, r1 = seen[0][e], seen[1][e]
        assert len(r0) == len(r1) == 10 and not set(r0) & set(r1)
        assert len(set(r0) | set(r1)) == 20
        # Each pass is exactly shard_indices for the next epoch, starting from `epoch`.
        assert r0 == data.shard_indices(labels, 2, 0, 3 + e, 9, sampler == "stratified").tolist()
    assert seen[0][0] != seen[0][1]  # reshuffled every epoch


def test_make_dataset_rejects_bad_arguments(ms: Any) -> None:
    src = IndexSource(np.arange(10) % 2)
    with pytest.raises(ValueError, match="unknown sampler"):
        data.make_dataset(src, 2, 2, 0, 0, 1, "random")
    with pytest.raises(ValueError, match="less than one batch"):
        data.make_dataset(src, 8, 2, 0, 0, 1, "even")
    with pytest.raises(ValueError, match="shard_id 2 is not in"):
        data.make_dataset(src, 2, 2, 2, 0, 1, "even")


def test_builtin_generator_sharding_duplicates_samples(ms: Any) -> None:
    # Why make_dataset does not use GeneratorDataset(num_shards=, shard_id=): with 21 samples over
    # 2 shards MindSpore 2.10 pads both to 11 by wrapping around, so one sample is on both ranks.
    import mindspore.dataset as ds

    src = IndexSource(np.zeros(21, np.int32))
    got = []
    for rank in range(2):
        dset = ds.GeneratorDataset(src, ["x", "y"], shuffle=False, num_shards=2, shard_id=rank)
        got.append([int(r["x"][0]) for r in dset.create_dict_iterator(num_epochs=1, output_numpy=True)])
    assert len(got[0]) == len(got[1]) == 11
    assert set(got[0]) & set(got[1])
