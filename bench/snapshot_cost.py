"""What one snapshot costs, part by part, on a model users train: MindCV 0.3's ResNet-18 (built as
its ``train.py`` builds it: ``create_model``, cosine schedule with warm-up, momentum, label
smoothing; synthetic images), ``examples/net.py``'s network (one Dense on 28x28 images, SGD:
``netpy``, use ``--batch 32``), or a small two-layer Dense net.

    .venv/bin/python bench/snapshot_cost.py [--model resnet18|netpy|dense] [--snapshots 10] [--steps 3]
        [--batch 8] [--image 32]
    .venv/bin/python bench/snapshot_cost.py --primitives 89   # each way to MAC and store 89 MiB, no model

Reported per snapshot, taken by ``store.Writer`` as the library takes them (medians from the
third on, once the memory's pages are in; CPU time of the thread doing it): the copy the training
thread pays (every kept parameter into the mapped pages of the file it is written as), then the
background write (``total_write``) and its parts: the MAC (HMAC-SHA256 over every byte:
``snapfile.dump``), the file's bytes written (``io``: the header and what was not copied into the
file's pages), and the rest (dropping, renaming, opening); the bytes; and one training step's time
on this machine, so each part reads as a share of a step (on CPU the background write takes
cores from the step's kernels, so it counts; on GPU/Ascend only the copy does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from mscon_resume import store  # noqa: E402
from mscon_resume.state import Kept  # noqa: E402


def build(model: str, batch: int, image: int) -> tuple[object, object, tuple]:
    """(train network, what keep holds, one synthetic batch)."""
    import mindspore as ms
    from mindspore import nn

    ms.set_seed(1)
    ms.set_context(mode=ms.GRAPH_MODE)
    if model == "resnet18":
        from mindcv.loss import create_loss
        from mindcv.models import create_model
        from mindcv.optim import create_optimizer
        from mindcv.scheduler import create_scheduler

        net = create_model("resnet18", num_classes=1000, pretrained=False)
        lr = create_scheduler(
            100, scheduler="cosine_decay", lr=0.1, min_lr=1e-6, warmup_epochs=1, num_epochs=2
        )
        opt = create_optimizer(net.trainable_params(), opt="momentum", lr=lr, momentum=0.9, weight_decay=1e-4)
        loss = create_loss(name="CE", label_smoothing=0.1)
        shape, classes = (batch, 3, image, image), 1000
    elif model == "netpy":  # examples/net.py (MindSpore's msrun sample): one Dense on MNIST, SGD
        net = nn.SequentialCell(nn.Flatten(), nn.Dense(28 * 28, 10, weight_init="normal"), nn.ReLU())
        opt = nn.SGD(net.trainable_params(), 1e-2)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        shape, classes = (batch, 1, 28, 28), 10
    else:
        net = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 10))
        opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        shape, classes = (batch, 32), 10
    # No loss-scale cell: its overflow check (NPUGetFloatStatusV2) has no CPU kernel in MindSpore
    # 2.10; it adds one scalar to a snapshot.
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    train.set_train()
    rng = np.random.default_rng(0)
    data = ms.Tensor(rng.standard_normal(shape).astype(np.float32))
    label = ms.Tensor(rng.integers(0, classes, shape[0]).astype(np.int32))
    return train, train, (data, label)


def primitives(mib: int) -> None:
    """What each way of making and keeping a snapshot's bytes costs on this machine, over ``mib`` MiB
    of float32 in 104 arrays (about ResNet-18's): the keyed hashes the standard library has, the
    zip's CRC-32, and the ways to put the bytes into /dev/shm. CPU time of this thread, best of 5."""
    import hashlib
    import hmac
    import mmap
    import zlib

    rng = np.random.default_rng(0)
    n = mib * 2**20 // 4
    arrays = [rng.standard_normal(k).astype(np.float32) for k in [n // 2, n // 4, n // 8] + [n // 800] * 101]
    views = [memoryview(a).cast("B") for a in arrays]
    total = sum(len(v) for v in views)
    key = os.urandom(32)

    def best(f: object, setup: object = None) -> float:
        got = []
        for _ in range(5):
            if setup is not None:
                setup()  # type: ignore[operator]
            c0 = time.thread_time()
            f()  # type: ignore[operator]
            got.append(time.thread_time() - c0)
        return min(got)

    def keyed(make: object) -> object:
        def run() -> None:
            h = make()  # type: ignore[operator]
            for v in views:
                h.update(v)
            h.digest()

        return run

    rows: list[tuple] = [
        ("HMAC-SHA256", keyed(lambda: hmac.new(key, digestmod=hashlib.sha256))),
        ("HMAC-SHA1", keyed(lambda: hmac.new(key, digestmod=hashlib.sha1))),
        ("HMAC-SHA512", keyed(lambda: hmac.new(key, digestmod=hashlib.sha512))),
        ("BLAKE2b keyed", keyed(lambda: hashlib.blake2b(key=key))),
        ("BLAKE2s keyed", keyed(lambda: hashlib.blake2s(key=key))),
        ("zip's CRC-32", lambda: [zlib.crc32(v) for v in views]),
    ]
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as root:
        where = os.path.join(root, "f")

        def write(flags: int) -> None:
            fd = os.open(where, flags, 0o600)
            for v in views:
                os.write(fd, v)
            os.close(fd)

        def gone() -> None:
            if os.path.exists(where):
                os.remove(where)

        def new() -> None:
            gone()
            write(os.O_WRONLY | os.O_CREAT)

        def copy(into: list[np.ndarray]) -> None:
            for dst, src in zip(into, arrays, strict=True):
                np.copyto(dst, src)

        rows.append(("write, a new file", lambda: write(os.O_WRONLY | os.O_CREAT), gone))
        rows.append(("remove that file", gone, new))
        rows.append(
            ("write over its pages", lambda: write(os.O_WRONLY), lambda: os.path.exists(where) or new())
        )
        for name, f, *setup in rows:
            print(f"  {name:28s} {1e3 * best(f, setup[0] if setup else None):8.1f} ms")
        fd = os.open(where, os.O_RDWR)
        mapped = mmap.mmap(fd, total)
        os.close(fd)
        at, into = 0, []
        for arr in arrays:
            into.append(np.frombuffer(mapped, np.float32, arr.size, at))
            at += arr.nbytes
        warm = [arr.copy() for arr in arrays]
        print(f"  {'copy into host memory (warm)':28s} {1e3 * best(lambda: copy(warm)):8.1f} ms")
        print(f"  {'copy into the mapped file':28s} {1e3 * best(lambda: copy(into)):8.1f} ms")
        into.clear()  # the views go before the map can close
        mapped.close()
    print(f"  ({total / 2**20:.1f} MiB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("resnet18", "netpy", "dense"), default="resnet18")
    ap.add_argument("--snapshots", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3, help="training steps timed (after one warm-up)")
    ap.add_argument("--batch", type=int, default=8, help="a rank's batch (bench/mindcv_resnet.py's)")
    ap.add_argument("--image", type=int, default=32, help="resnet18: the synthetic images' side")
    ap.add_argument("--primitives", type=int, metavar="MIB", help="time the primitives over MIB MiB instead")
    args = ap.parse_args()
    if args.primitives:
        primitives(args.primitives)
        return 0

    train, keep, batch = build(args.model, args.batch, args.image)
    train(*batch)  # compile
    step_s = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        out = train(*batch)
        float(out.asnumpy())
        step_s.append(time.perf_counter() - t0)

    kept = Kept(keep)
    params = kept.params
    nbytes = sum(int(p.nbytes) for _, p in params)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as root:
        w = store.Writer(root, 0, os.urandom(32))  # as the library takes them, one after another
        for step in range(1, args.snapshots + 1):
            w.submit(step, params, {"epoch": 0, "pos": step})
            w.wait()
        w.close()
    assert w.error is None, w.error
    later = slice(2, None)  # the first two copies and writes fault their memory's pages in
    parts = {
        "copy": w.copies[later],
        "mac": w.macs[later],
        "io": w.ios[later],
        "rest": [t - m - i for t, m, i in zip(w.writes, w.macs, w.ios, strict=True)][later],
        "total_write": w.writes[later],
    }
    step = statistics.median(step_s)
    print(f"model {args.model}: {len(params)} kept arrays, {nbytes / 2**20:.1f} MiB per snapshot")
    images = f", {args.image}x{args.image} images" if args.model == "resnet18" else ""
    what = f"batch {args.batch}{images}, CPU"
    print(f"one training step ({what}): median {1e3 * step:.0f} ms of {args.steps}")
    for name in ("copy", "mac", "io", "rest", "total_write"):
        v = statistics.median(parts[name])
        print(f"  {name:12s} {1e3 * v:8.1f} ms  {100 * v / step:6.2f} % of a step")
    copy, total = statistics.median(parts["copy"]), statistics.median(parts["total_write"])
    print(
        f"a snapshot every step costs the step {100 * copy / step:.2f} % (the copy) on an accelerator, "
        f"{100 * (copy + total) / step:.2f} % (copy and write) where the host computes the step"
    )
    return 0


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("BENCH_DUMP_AFTER_S", "1e9")), exit=True)
    sys.exit(main())
