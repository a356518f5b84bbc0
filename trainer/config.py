"""The trainer's command line and every check that can run before MindSpore is imported.

The seeds' pitfalls are caught here with one-line errors (exit 2): wrong parallel-mode names,
PyNative with semi/auto parallel, sharding strategies that are not powers of two or do not
multiply to the device count, device_num that disagrees with the launched cluster, and the
modes the CPU backend refuses.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

from trainer.runners import RUNNERS
from trainer.runners import choose as choose_runner

PARALLEL_MODES = ("stand_alone", "data_parallel", "semi_auto_parallel", "auto_parallel", "hybrid_parallel")
# The CPU backend (MCCL) runs data parallel only: MindSpore refuses the others at graph compile
# ("Invalid communication backend: CPU for semi_auto_parallel/auto_parallel mode").
CPU_MODES = ("stand_alone", "data_parallel")
ALIASES = {
    "dp": "data_parallel",
    "ddp": "data_parallel",
    "data": "data_parallel",
    "standalone": "stand_alone",
    "single": "stand_alone",
    "none": "stand_alone",
    "semi": "semi_auto_parallel",
    "semi_auto": "semi_auto_parallel",
    "auto": "auto_parallel",
    "hybrid": "hybrid_parallel",
    "model_parallel": "semi_auto_parallel",
}
SEARCH_MODES = ("sharding_propagation", "dynamic_programming", "recursive_programming")
AMP_LEVELS = ("O0", "O1", "O2", "O3")
LOSS_SCALES = ("none", "fixed", "dynamic")
MODELS = ("mlp", "lenet", "resnet18", "resnet50")
DATASETS = ("synthetic", "mnist", "imagefolder")


def fail(msg: str) -> NoReturn:
    print(f"train.py: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def normalise_mode(mode: str) -> str:
    """The MindSpore name for ``mode``, or a one-line error with a hint."""
    if mode in PARALLEL_MODES:
        return mode
    norm = mode.strip().lower().replace("-", "_").replace(" ", "_")
    norm = norm.removeprefix("parallelmode.")
    guess = norm if norm in PARALLEL_MODES else ALIASES.get(norm)
    if guess is None:
        close = difflib.get_close_matches(norm, PARALLEL_MODES, n=1)
        guess = close[0] if close else None
    hint = f" (did you mean '{guess}'?)" if guess else ""
    fail(f"invalid --parallel-mode '{mode}'{hint}; valid: {', '.join(PARALLEL_MODES)}")


def parse_strategy(text: str) -> tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        fail(f"--strategy {text!r}: expected comma-separated integers like 4,2 (data x model)")
    for p in parts:
        if p < 1 or p & (p - 1):
            fail(f"--strategy {text!r}: every split must be a power of 2, got {p}")
    return parts


@dataclass(frozen=True)
class Cluster:
    """What the launcher told this process (read before MindSpore's init)."""

    in_cluster: bool
    is_scheduler: bool
    size: int


def cluster_from_env() -> Cluster:
    role = os.environ.get("MS_ROLE", "")
    size = int(os.environ.get("RANK_SIZE") or os.environ.get("MS_WORKER_NUM") or 1)
    return Cluster(in_cluster=bool(role) or size > 1, is_scheduler=role == "MS_SCHED", size=size)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train.py",
        description="mscon trainer: MindSpore distributed training from the seeds' recipes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("model and data")
    g.add_argument("--model", choices=MODELS, default="mlp")
    g.add_argument("--dataset", choices=DATASETS, default="synthetic")
    g.add_argument("--data-path", help="MNIST idx folder or ImageFolder root")
    g.add_argument("--image-size", type=int, default=32, help="ImageFolder images are resized to this")
    g.add_argument("--num-classes", type=int, default=10)
    g.add_argument(
        "--num-samples", type=int, help="synthetic samples (default: steps-per-epoch x batch-size)"
    )
    g.add_argument("--imbalance", type=float, default=0.0, help="synthetic class skew (0 = balanced)")
    g.add_argument(
        "--sampler",
        choices=("even", "stratified"),
        default="even",
        help="even shards, or class-stratified shards (the uneven-shard fix of seed 000)",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=2)
    g.add_argument(
        "--steps-per-epoch", type=int, default=20, help="optimizer updates per epoch (a cap for files)"
    )
    g.add_argument("--batch-size", type=int, default=32, help="global batch per optimizer update")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches accumulated per update")
    g.add_argument("--lr", type=float, default=0.1, help="Momentum learning rate (ResNets want ~0.005)")
    g.add_argument("--momentum", type=float, default=0.9)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--amp-level", choices=AMP_LEVELS, default="O0")
    g.add_argument("--loss-scale", choices=LOSS_SCALES, default="none")
    g.add_argument("--loss-scale-value", type=float, default=2.0**10, help="(initial) loss scale")
    g.add_argument(
        "--recompute", action="store_true", help="recompute activations in backward (saves memory)"
    )
    g.add_argument("--seed", type=int, default=1, help="weights and data seed, the same on every rank")
    g = p.add_argument_group("parallelism")
    g.add_argument(
        "--parallel-mode", help=f"one of {', '.join(PARALLEL_MODES)}; default: data_parallel if >1 rank"
    )
    g.add_argument("--device-target", choices=("CPU", "GPU", "Ascend"), default="CPU")
    g.add_argument("--device-num", type=int, help="expected number of ranks (checked against the cluster)")
    g.add_argument("--exec-mode", choices=("graph", "pynative"), default="graph")
    g.add_argument(
        "--search-mode", choices=SEARCH_MODES, default="sharding_propagation", help="auto_parallel"
    )
    g.add_argument("--strategy", help="semi_auto_parallel split of the MLP's layers, data x model, e.g. 4,2")
    g.add_argument("--parallel-optimizer", action="store_true", help="shard optimizer state (semi/auto)")
    g.add_argument(
        "--comm-fusion-mb", type=int, default=0, help="AllReduce fusion threshold in MB (0: default)"
    )
    g.add_argument(
        "--runner",
        choices=RUNNERS,
        default="auto",
        help="cell: the whole step as one graph (TrainOneStepWithLossScaleCell), which semi/auto/hybrid "
        "need; functional: separately compiled pieces, which --grad-accum needs; auto: cell unless "
        "--grad-accum > 1",
    )
    g.add_argument("--strategy-ckpt-dir", help="save/load parallel strategy files here (semi/auto)")
    g = p.add_argument_group("checkpoints and observability")
    g.add_argument("--checkpoint-dir", help="rank-aware checkpoints: DIR/rank_N/step_S.ckpt")
    g.add_argument("--checkpoint-every", type=int, default=10, help="save every N optimizer steps")
    g.add_argument("--keep-checkpoints", type=int, default=3)
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest state all ranks have: a snapshot (--snapshot-every) or a checkpoint",
    )
    g.add_argument(
        "--snapshot-every",
        type=_snapshot_every,
        default=0,
        help="copy the training state every N steps and write it in the background to node-local memory, "
        "so a restart loses at most N steps (0: off; off too without --snapshot-dir or --checkpoint-dir: "
        "mscon adds the latter when it may restart the job); 'auto': the fewest steps between copies "
        "that keep their cost under --snapshot-budget of the step time, measured and agreed by the ranks",
    )
    g.add_argument(
        "--snapshot-budget",
        type=float,
        default=0.02,
        help="with --snapshot-every auto: the share of the step time copying may take (default 0.02)",
    )
    g.add_argument(
        "--snapshot-dir",
        help="where snapshots go (default: /dev/shm/mscon-<digest of --checkpoint-dir> when it has room, "
        "else CHECKPOINT_DIR/snapshots)",
    )
    g.add_argument("--checksum-every", type=int, default=10, help="report a parameter checksum every N steps")
    g.add_argument("--log-rank0-only", action="store_true", help="only rank 0 prints step lines")
    g.add_argument("--profile-steps", help="MindSpore Profiler for steps A:B, e.g. 5:10")
    g.add_argument("--profile-dir", default="profiler", help="where the profiler writes")
    g = p.add_argument_group("testing mscon")
    g.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    g.add_argument("--slow-rank", type=int, default=-1, help="the rank --slow applies to (a straggler)")
    g.add_argument(
        "--slow",
        type=float,
        default=1.0,
        help="--slow-rank loads each batch so long that its step takes this many times its own time",
    )
    g.add_argument(
        "--die-at-step",
        type=int,
        help="SIGKILL this process at this optimizer step (first attempt only: a restarted group resumes)",
    )
    g.add_argument("--die-rank", type=int, default=0, help="the rank --die-at-step applies to")
    g.add_argument(
        "--stall-at-step",
        type=int,
        help="before this optimizer step, sleep --stall-s seconds in silence (first attempt only; "
        "step 1: as a long first compile would)",
    )
    g.add_argument("--stall-rank", type=int, default=0, help="the rank --stall-at-step applies to (-1: all)")
    g.add_argument("--stall-s", type=float, default=0.0, help="how long --stall-at-step sleeps (0: forever)")
    return p


def parse_args(argv: list[str] | None = None, cluster: Cluster | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    cluster = cluster or cluster_from_env()
    size = cluster.size
    for name in (
        "epochs",
        "steps_per_epoch",
        "batch_size",
        "grad_accum",
        "checkpoint_every",
        "checksum_every",
    ):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1")
    if args.keep_checkpoints < 2:
        fail("--keep-checkpoints must be >= 2 (a rank killed mid-save must still find an older one)")
    if args.step_sleep < 0:
        fail("--step-sleep must be >= 0")
    if args.slow < 1.0:
        fail("--slow must be >= 1 (a straggler is slower, not faster)")
    mode = normalise_mode(args.parallel_mode) if args.parallel_mode else None
    if mode is None:
        mode = "data_parallel" if size > 1 else "stand_alone"
    if size == 1 and mode == "data_parallel":
        mode = "stand_alone"
    args.parallel_mode = mode
    if args.device_num is not None and args.device_num != size:
        fail(
            f"--device-num {args.device_num} does not match the {size} rank(s) launched "
            "(RANK_SIZE/MS_WORKER_NUM)"
        )
    if mode in ("semi_auto_parallel", "auto_parallel") and args.exec_mode == "pynative":
        fail(
            f"--parallel-mode {mode} needs graph mode: PyNative runs it op by op without the strategy search"
        )
    if args.device_target == "CPU" and mode not in CPU_MODES:
        fail(
            f"--parallel-mode {mode}: the CPU backend refuses it (MindSpore supports only data parallel "
            "on CPU); run it on GPU or Ascend"
        )
    if args.strategy is not None:
        if mode != "semi_auto_parallel":
            fail("--strategy applies to --parallel-mode semi_auto_parallel only")
        if args.model != "mlp":
            fail(
                "--strategy: hand-written strategies exist for --model mlp; use auto_parallel for the others"
            )
        strategy = parse_strategy(args.strategy)
        if len(strategy) != 2 or strategy[0] * strategy[1] != size:
            fail(f"--strategy {args.strategy}: data x model must multiply to the {size} rank(s)")
        args.strategy = strategy
    elif mode == "semi_auto_parallel":
        args.strategy = (size, 1)
    if args.parallel_optimizer and mode not in ("semi_auto_parallel", "auto_parallel"):
        # MindSpore's data_parallel optimizer sharding takes Lamb/AdamWeightDecay/AdaFactor on Ascend
        # only; this trainer's optimizer is Momentum. semi/auto shard it in the graph instead.
        fail(
            f"--parallel-optimizer needs semi_auto_parallel or auto_parallel, not {mode} (MindSpore "
            "shards the optimizer in data_parallel only for Lamb/AdamWeightDecay/AdaFactor on Ascend)"
        )
    if args.batch_size % (size * args.grad_accum):
        fail(
            f"--batch-size {args.batch_size} must divide evenly into {size} rank(s) x {args.grad_accum} "
            "micro-batch(es)"
        )
    if args.loss_scale == "none" and args.amp_level in ("O2", "O3"):
        args.loss_scale = "dynamic"  # fp16 gradients underflow without it (seed 004)
    if args.dataset != "synthetic" and not args.data_path:
        fail(f"--dataset {args.dataset} needs --data-path")
    if args.profile_steps is not None:
        try:
            a, b = (int(x) for x in args.profile_steps.split(":"))
        except ValueError:
            fail(f"--profile-steps {args.profile_steps!r}: expected A:B, e.g. 5:10")
        if not 1 <= a < b:
            fail(f"--profile-steps {args.profile_steps!r}: need 1 <= A < B")
        args.profile_steps = (a, b)
    try:
        args.runner = choose_runner(args.runner, mode, args.grad_accum)
    except ValueError as exc:
        fail(str(exc))
    if args.resume and not args.checkpoint_dir:
        fail("--resume needs --checkpoint-dir")
    if args.snapshot_every != AUTO and args.snapshot_every < 0:
        fail("--snapshot-every must be >= 0 (0: off) or auto")
    if not 0 < args.snapshot_budget < 1:
        fail("--snapshot-budget must be between 0 and 1 (a share of the step time)")
    if args.snapshot_every == AUTO and args.parallel_mode not in ("stand_alone", "data_parallel"):
        # Its agreement is a plain AllReduce mid-training: the other modes' contexts would shard it.
        fail("--snapshot-every auto works with data_parallel or stand_alone: give a number of steps")
    return args


AUTO = "auto"  # --snapshot-every auto


def _snapshot_every(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps or {AUTO}, got {text!r}") from None


def ranks_are_replicas(args: argparse.Namespace) -> bool:
    """Whether every rank must hold the same parameters (so their checksums can be compared).

    Model split, optimizer sharding and auto_parallel's own strategies leave each rank a slice.
    """
    mode = args.parallel_mode
    if mode in ("stand_alone", "data_parallel", "hybrid_parallel"):
        return True
    if mode == "semi_auto_parallel":
        return args.strategy[1] == 1 and not args.parallel_optimizer
    return False
