"""mscon trainer: a small, real MindSpore data-parallel training entry point.

Launched by the mscon console once per node (scheduler + N workers of this same
script, MindSpore dynamic-cluster env vars), under ``msrun``, or stand-alone.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time
from typing import Any, NoReturn

import numpy as np

VALID_MODES = ("stand_alone", "data_parallel")
# MindSpore knows these, but they need sharding strategies and the CPU backend refuses them.
REFUSED_MODES = ("semi_auto_parallel", "auto_parallel", "hybrid_parallel")
ALIASES = {
    "dp": "data_parallel",
    "ddp": "data_parallel",
    "data": "data_parallel",
    "standalone": "stand_alone",
    "single": "stand_alone",
    "none": "stand_alone",
}
NUM_CLASSES = 10
MLP_FEATURES = 32


def fail(msg: str) -> NoReturn:
    """One-line error and argparse's usage-error exit code, before MindSpore is even imported."""
    print(f"train.py: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def check_parallel_mode(mode: str, device_target: str) -> None:
    if mode in VALID_MODES:
        return
    valid = ", ".join(VALID_MODES)
    if mode in REFUSED_MODES:
        why = (
            "the CPU backend refuses it (CPU only supports data parallel)"
            if device_target == "CPU"
            else "this trainer has no sharding strategies for it"
        )
        fail(f"--parallel-mode {mode}: {why}; valid: {valid}")
    norm = mode.strip().lower().replace("-", "_").replace(" ", "_")
    guess = norm if norm in VALID_MODES + REFUSED_MODES else ALIASES.get(norm)
    if guess is None:
        close = difflib.get_close_matches(norm, VALID_MODES, n=1)
        guess = close[0] if close else None
    hint = f" (did you mean '{guess}'?)" if guess else ""
    fail(f"invalid --parallel-mode '{mode}'{hint}; valid: {valid}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="train.py",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--epochs", type=int, default=2, help="training epochs")
    p.add_argument("--steps-per-epoch", type=int, default=20, help="steps per epoch (on every rank)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch, split evenly over ranks")
    p.add_argument("--lr", type=float, default=0.05, help="Momentum learning rate")
    p.add_argument("--model", choices=("mlp", "lenet"), default="mlp", help="network")
    p.add_argument("--dataset", choices=("synthetic",), default="synthetic", help="data source")
    p.add_argument(
        "--parallel-mode",
        default=None,
        help=f"one of {', '.join(VALID_MODES)}; unset: data_parallel if rank size > 1",
    )
    p.add_argument("--device-target", choices=("CPU", "GPU", "Ascend"), default="CPU", help="backend")
    p.add_argument("--seed", type=int, default=1, help="weights + data seed, same on every rank")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (tests)")
    args = p.parse_args(argv)
    if args.parallel_mode is not None:
        check_parallel_mode(args.parallel_mode, args.device_target)
    for name in ("epochs", "steps_per_epoch", "batch_size"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1")
    if args.step_sleep < 0:
        fail("--step-sleep must be >= 0")
    return args


class TeacherData:
    """Random-access synthetic source: labels come from a fixed random linear teacher,
    so the task is learnable. Images (lenet) also carry a per-class pattern, since a
    linear teacher on 1024 pixels of noise is too hard to learn in a few steps.
    Same seed on every rank -> identical data; GeneratorDataset sharding then gives
    each rank a disjoint slice."""

    def __init__(self, n: int, shape: tuple[int, ...], seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((n, *shape)).astype(np.float32)
        teacher = rng.standard_normal((int(np.prod(shape)), NUM_CLASSES)).astype(np.float32)
        self.y = np.argmax(self.x.reshape(n, -1) @ teacher, axis=1).astype(np.int32)
        if len(shape) > 1:
            patterns = rng.standard_normal((NUM_CLASSES, *shape)).astype(np.float32)
            self.x += patterns[self.y]

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[i], self.y[i]

    def __len__(self) -> int:
        return len(self.y)


def build_net(kind: str) -> Any:
    from mindspore import nn

    if kind == "lenet":
        return nn.SequentialCell(
            nn.Conv2d(1, 6, 5, pad_mode="valid"),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 16, 5, pad_mode="valid"),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            nn.Flatten(),
            nn.Dense(16 * 5 * 5, 120),
            nn.ReLU(),
            nn.Dense(120, 84),
            nn.ReLU(),
            nn.Dense(84, NUM_CLASSES),
        )
    return nn.SequentialCell(nn.Dense(MLP_FEATURES, 64), nn.ReLU(), nn.Dense(64, NUM_CLASSES))


def make_step_callback(per_rank_batch: int, step_sleep: float, metrics_path: str | None) -> Any:
    from mindspore.train import Callback

    class StepLog(Callback):
        """LossMonitor-compatible stdout line (the console parses it) + JSON-lines metrics."""

        def __init__(self) -> None:
            super().__init__()
            self.t0 = 0.0
            # One writer per rank, line-buffered so a killed rank leaves whole lines behind.
            self.out = open(metrics_path, "a", buffering=1) if metrics_path else None

        def on_train_step_begin(self, run_context: Any) -> None:
            self.t0 = time.perf_counter()
            if step_sleep > 0:  # inside the timed window: metrics show the rate a test actually sees
                time.sleep(step_sleep)

        def on_train_step_end(self, run_context: Any) -> None:
            cb = run_context.original_args()
            dt = time.perf_counter() - self.t0
            loss = float(np.mean(cb.net_outputs.asnumpy()))
            step_in_epoch = (cb.cur_step_num - 1) % cb.batch_num + 1
            print(f"epoch: {cb.cur_epoch_num} step: {step_in_epoch}, loss is {loss:.6f}", flush=True)
            if self.out:
                rec = {"step": cb.cur_step_num, "epoch": cb.cur_epoch_num, "loss": loss, "step_time_s": dt}
                rec |= {"samples_per_s": per_rank_batch / dt if dt > 0 else 0.0, "ts": time.time()}
                self.out.write(json.dumps(rec) + "\n")

        def on_train_end(self, run_context: Any) -> None:
            if self.out:
                self.out.close()

    return StepLog()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    in_cluster = bool(os.environ.get("MS_ROLE")) or int(os.environ.get("RANK_SIZE", "1")) > 1
    is_sched = os.environ.get("MS_ROLE") == "MS_SCHED"
    env_size = int(os.environ.get("RANK_SIZE") or os.environ.get("MS_WORKER_NUM") or 1)
    if args.batch_size % env_size:  # checked before the slow import/init, then again after init
        fail(f"--batch-size {args.batch_size} is not divisible by rank size {env_size}")

    if is_sched:
        print(f"mscon-trainer scheduler for {env_size} workers", flush=True)
    # MindSpore's C++ WARNING chatter (topology retries, comm groups) drowns the loss lines;
    # keep ERRORs only unless the caller asked for more.
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init

    # No DEVICE_ID (e.g. under msrun) -> None lets MindSpore negotiate the device per rank.
    device_id = os.environ.get("DEVICE_ID")
    ms.set_device(args.device_target, int(device_id) if device_id else None)
    ms.set_context(mode=ms.GRAPH_MODE)
    rank, size = 0, 1
    if is_sched:
        # The scheduler only coordinates: init() serves the cluster and the C++ side exits
        # the process (rc 0) itself once every worker has unregistered. If a worker dies
        # it raises after the node timeout instead; turn that into one line + rc 1.
        try:
            init()
        except RuntimeError as e:
            print(
                f"mscon-trainer scheduler: cluster failed: {str(e).strip().splitlines()[0]}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        return 0
    if in_cluster:
        init()
        rank, size = get_rank(), get_group_size()
    if args.batch_size % size:
        fail(f"--batch-size {args.batch_size} is not divisible by rank size {size}")
    mode = args.parallel_mode or ("data_parallel" if size > 1 else "stand_alone")
    if size == 1:
        mode = "stand_alone"
    if mode == "data_parallel":
        # gradients_mean: all-reduced grads are averaged, so lr means the same at any rank count.
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(args.seed)  # identical initial weights on every rank
    print(f"mscon-trainer rank {rank}/{size} device {args.device_target} mode {mode}", flush=True)

    import mindspore.dataset as ds

    per_rank = args.batch_size // size
    shape = (1, 32, 32) if args.model == "lenet" else (MLP_FEATURES,)
    source = TeacherData(args.steps_per_epoch * args.batch_size, shape, args.seed)
    data = ds.GeneratorDataset(source, ["x", "y"], shuffle=True, num_shards=size, shard_id=rank)
    data = data.batch(per_rank, drop_remainder=True)

    net = build_net(args.model)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=args.lr, momentum=0.9)
    model = ms.Model(net, loss_fn, opt)
    cb = make_step_callback(per_rank, args.step_sleep, os.environ.get("MSCON_METRICS"))
    model.train(args.epochs, data, callbacks=[cb], dataset_sink_mode=False)
    print("training finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
