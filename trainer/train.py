"""mscon trainer: MindSpore distributed training from the seeds' recipes, watched by mscon.

Launched by the mscon console on every node (one scheduler + N workers of this same script with
MindSpore's dynamic-cluster environment), under ``msrun``, or stand-alone. ``--help`` lists the
knobs; ``trainer/config.py`` holds the checks that run before MindSpore is imported.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script (`python trainer/train.py`): make `import trainer.x` work from the repo root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mscon_resume import core as resume_core  # noqa: E402 - the library every script uses
from mscon_resume import env as resume_env  # noqa: E402
from mscon_resume import store  # noqa: E402
from mscon_resume.metrics import MetricsWriter  # noqa: E402
from trainer import checkpoint, runners  # noqa: E402
from trainer.config import Cluster, cluster_from_env, fail, parse_args, ranks_are_replicas  # noqa: E402
from trainer.metrics import param_checksum  # noqa: E402
from trainer.straggler import SlowLoader  # noqa: E402


def run_scheduler(cluster: Cluster) -> int:
    """The scheduler only coordinates: init() serves the cluster, and MindSpore's C++ side ends the
    process (rc 0) once every worker has unregistered. If a worker dies, init() raises after the
    node timeout instead; that becomes one line and rc 1."""
    print(f"mscon-trainer scheduler for {cluster.size} workers", flush=True)
    from mindspore.communication import init

    try:
        init()
    except RuntimeError as exc:
        print(f"mscon-trainer scheduler: cluster failed: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


def configure_parallel(ms: Any, args: Any, size: int) -> None:
    """set_auto_parallel_context for the chosen mode (seeds 000, 002, 004)."""
    if args.parallel_mode == "stand_alone":
        return
    kw: dict[str, Any] = {"gradients_mean": True}
    modes = {
        "data_parallel": ms.ParallelMode.DATA_PARALLEL,
        "semi_auto_parallel": ms.ParallelMode.SEMI_AUTO_PARALLEL,
        "auto_parallel": ms.ParallelMode.AUTO_PARALLEL,
        "hybrid_parallel": ms.ParallelMode.HYBRID_PARALLEL,
    }
    kw["parallel_mode"] = modes[args.parallel_mode]
    if args.parallel_mode == "auto_parallel":
        kw["search_mode"] = args.search_mode
    if args.parallel_optimizer:
        kw["enable_parallel_optimizer"] = True  # optimizer sharding (ZeRO-1-like)
    if args.parallel_mode in ("semi_auto_parallel", "auto_parallel") and args.strategy_ckpt_dir:
        os.makedirs(args.strategy_ckpt_dir, exist_ok=True)
        path = os.path.join(args.strategy_ckpt_dir, "strategy.ckpt")
        key = "load_file" if os.path.exists(path) else "save_file"
        kw["strategy_ckpt_config"] = {key: path}
    if args.comm_fusion_mb:
        kw["comm_fusion"] = {"allreduce": {"mode": "size", "config": args.comm_fusion_mb}}
    ms.set_auto_parallel_context(**kw)


def apply_strategy(net: Any, strategy: tuple[int, int]) -> None:
    """semi_auto_parallel for the MLP, Megatron style: fc1 splits its output features over the model
    axis (data x model) and its bias and the ReLU keep that split, so the hidden layer never moves;
    fc2 contracts over it and MindSpore inserts the one AllReduce of the partial sums. Every operator
    gets a strategy: an unannotated one would default to a batch split and force redistributions.
    nn.Dense multiplies by its (out, in) weight with transpose_b, so a weight's strategy is written
    (out split, in split)."""
    dp, mp = strategy
    net.fc1.matmul.shard(((dp, 1), (mp, 1)))
    net.fc1.bias_add.shard(((dp, mp), (mp,)))
    net.relu.relu.shard(((dp, mp),))
    net.fc2.matmul.shard(((dp, mp), (1, mp)))
    net.fc2.bias_add.shard(((dp, 1), (1,)))


def device_memory(ms: Any) -> int | None:
    try:
        used = int(ms.runtime.max_memory_allocated())
    except Exception:  # noqa: BLE001 - not every backend reports it
        return None
    return used or None  # the CPU backend answers 0: "not reported"


class Profiling:
    """MindSpore Profiler over a window of optimizer steps; the output path goes to the metrics."""

    def __init__(self, window: tuple[int, int] | None, out_dir: str, rank: int) -> None:
        self.window = window
        self.out_dir = os.path.abspath(os.path.join(out_dir, f"rank_{rank}"))
        self.profiler: Any = None
        self.done_path: str | None = None

    def before(self, step: int) -> None:
        if self.window and step == self.window[0] and self.profiler is None:
            from mindspore import Profiler

            os.makedirs(self.out_dir, exist_ok=True)
            self.profiler = Profiler(start_profile=False, output_path=self.out_dir)
            self.profiler.start()

    def after(self, step: int) -> str | None:
        if self.profiler is not None and self.window and step == self.window[1]:
            self.profiler.stop()
            self.profiler.analyse()
            self.profiler = None
            self.done_path = self.out_dir
            print(f"mscon-trainer: profiler output in {self.out_dir}", flush=True)
            return self.out_dir
        return None


def load_source(args: Any) -> Any:
    """The dataset's samples (not yet sharded), or a one-line error."""
    from trainer import data, models

    shape = {
        "synthetic": models.input_shape(args.model, None),
        "imagefolder": (3, args.image_size, args.image_size),
    }.get(args.dataset)
    synthetic = args.dataset == "synthetic"
    try:
        source = data.make_source(
            args.dataset,
            args.data_path,
            shape,
            args.num_samples or (args.steps_per_epoch * args.batch_size if synthetic else None),
            args.num_classes,
            args.seed,
            imbalance=args.imbalance,
        )
        models.input_shape(args.model, tuple(source.sample_shape))  # does this model take this data?
    except ValueError as exc:
        fail(str(exc))
    return source


def build_network(ms: Any, args: Any, source: Any) -> Any:
    """The model for this data, with recompute, AMP and the semi_auto strategy applied."""
    from trainer import models

    features = math.prod(source.sample_shape) if args.model == "mlp" else None
    in_channels = source.sample_shape[0] if len(source.sample_shape) == 3 else 1
    net = models.build_model(args.model, source.num_classes, in_channels=in_channels, features=features)
    if args.recompute:
        for cell in net.cells():
            cell.recompute()
    if args.amp_level != "O0":
        net = ms.amp.auto_mixed_precision(net, args.amp_level)
    if args.parallel_mode == "semi_auto_parallel":
        apply_strategy(net, args.strategy)
    return net


def main(argv: list[str] | None = None) -> int:
    cluster = cluster_from_env()
    args = parse_args(argv, cluster)
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings drown the loss lines
    if cluster.is_scheduler:
        return run_scheduler(cluster)

    metrics = MetricsWriter(os.environ.get(resume_env.METRICS))
    import mindspore as ms

    metrics.phase("imported")
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init

    from trainer import data

    device_id = os.environ.get("DEVICE_ID")  # unset under msrun: MindSpore picks per rank
    ms.set_device(args.device_target, int(device_id) if device_id else None)
    ms.set_context(mode=ms.GRAPH_MODE if args.exec_mode == "graph" else ms.PYNATIVE_MODE)
    rank, size = 0, 1
    if cluster.in_cluster:
        init()
        rank, size = get_rank(), get_group_size()
    metrics.phase("joined")
    if size != cluster.size:
        fail(f"the cluster has {size} ranks but the launcher announced {cluster.size}")
    say = rank == 0 or not args.log_rank0_only
    if say:
        print(
            f"mscon-trainer rank {rank}/{size} device {args.device_target} mode {args.parallel_mode} "
            f"model {args.model} amp {args.amp_level} accum {args.grad_accum} runner {args.runner}",
            flush=True,
        )

    micro_batch = args.batch_size // (size * args.grad_accum)
    source = load_source(args)
    steps_per_epoch = min(args.steps_per_epoch, len(source) // (size * micro_batch) // args.grad_accum)
    if steps_per_epoch < 1:
        fail(
            f"{len(source)} samples are too few for {size} rank(s) x batch {micro_batch} "
            f"x accum {args.grad_accum}"
        )
    total_steps = args.epochs * steps_per_epoch
    snapshots = bool(args.snapshot_every) and bool(args.snapshot_dir or args.checkpoint_dir)
    resumer = resume_core.Resumer(
        state_dir=args.checkpoint_dir,
        every=args.snapshot_every if snapshots else 0,
        budget=args.snapshot_budget,
        metrics=metrics,
        say=(lambda text: print(f"mscon-trainer: {text}", flush=True)) if say else (lambda text: None),
        snapshot_dir=args.snapshot_dir,
        phases=False,  # the trainer records its own milestones, where they happen
    )
    # Before the parallel context is set: the agreement's AllReduce is a plain graph, which
    # semi/auto parallel would try to shard like the model.
    every = args.checkpoint_every
    got = resumer.resume(
        resuming=bool(args.resume),
        slots=checkpoint.slot_vector(args.checkpoint_dir, rank, every, total_steps) if args.resume else None,
        slot_step=lambda counts: checkpoint.agreed_step(counts, size, every),
        announce=False,
    )
    start = got.step

    configure_parallel(ms, args, size)
    ms.set_seed(args.seed)  # identical initial weights and data order on every rank (seed 003)
    net = build_network(ms, args, source)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), args.lr, args.momentum, weight_decay=args.weight_decay)
    runner = runners.make_runner(args.runner, ms, net, loss_fn, opt, size, args)
    if start:
        # Full tensors, loaded before the first compile: a sharded mode slices them there.
        if got.source == resume_core.SNAPSHOT:
            params, meta, what = resume_core.as_parameters(got.params), got.meta, "snapshot"
            resumer.restore_rng(got)
        else:
            params, meta = checkpoint.load(args.checkpoint_dir, rank, start)
            what = "checkpoint"
        runner.restore(params)
        if say:
            saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta.get("saved_at", 0)))
            # The checksum the step-``start`` metric of the attempt before reported: the same state.
            same = f"; parameter checksum {param_checksum(net)}" if ranks_are_replicas(args) else ""
            print(f"mscon-trainer: resumed from step {start} ({what} saved {saved}){same}", flush=True)
    elif args.resume and say:
        print("mscon-trainer: no checkpoint every rank has; starting from step 0", flush=True)

    got = resume_core.Resumed(start, got.source)  # loaded: its memory is not needed any more
    if snapshots:
        resumer.keep(store.named_params(runner.checkpoint_payload()))
    replicas = ranks_are_replicas(args)  # only then must every rank's parameters be equal
    profiling = Profiling(args.profile_steps, args.profile_dir, rank)
    straggler = SlowLoader(args.slow if rank == args.slow_rank else 1.0)
    step = start
    for epoch in range(start // steps_per_epoch, args.epochs):
        dataset = data.make_dataset(source, micro_batch, size, rank, epoch, args.seed, args.sampler)
        batches = dataset.create_tuple_iterator(num_epochs=1)
        skip = (step - epoch * steps_per_epoch) * args.grad_accum  # resuming mid-epoch
        for _ in range(skip):
            next(batches)
        while step < (epoch + 1) * steps_per_epoch:
            profiling.before(step + 1)
            if step == start:  # model and data set built: the first batch, compile and step follow
                metrics.phase("ready")
            if (
                args.stall_at_step == step + 1
                and args.stall_rank in (rank, -1)
                and os.environ.get(resume_env.ATTEMPT, "0") == "0"
            ):
                time.sleep(args.stall_s or 1e9)  # a hang, or a first compile that takes long
            t0 = time.perf_counter()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            batch = [next(batches) for _ in range(args.grad_accum)]
            straggler.load()  # a slow loader on --slow-rank, before it arrives in the step
            arrive_ts = time.time()
            loss, overflow = runner.step(batch)
            dt = time.perf_counter() - t0
            straggler.took(dt)
            if step == start:  # this attempt's first step: its graphs are compiled now
                metrics.phase("compiled")
            step += 1
            in_epoch = step - epoch * steps_per_epoch
            if say:
                print(f"epoch: {epoch + 1} step: {in_epoch}, loss is {loss:.6f}", flush=True)
            record: dict[str, Any] = {
                "step": step,
                "epoch": epoch + 1,
                "loss": loss,
                "step_time_s": dt,
                "arrive_ts": arrive_ts,
                "samples_per_s": micro_batch * args.grad_accum / dt if dt > 0 else None,
                "loss_scale": runner.loss_scale,
                "overflow": overflow,
                "device_memory_bytes": device_memory(ms),
            }
            if replicas and (step % args.checksum_every == 0 or step == total_steps):
                record["param_checksum"] = param_checksum(net)
            profile_dir = profiling.after(step)
            if profile_dir:
                record["profile_dir"] = profile_dir
            resumer.stepped(step, epoch, in_epoch, dt, record)
            if args.checkpoint_dir and (step % args.checkpoint_every == 0):
                checkpoint.save(
                    args.checkpoint_dir,
                    rank,
                    step,
                    runner.checkpoint_payload(),
                    {"epoch": epoch + 1},
                    args.keep_checkpoints,
                )
            if args.die_at_step == step and os.environ.get(resume_env.ATTEMPT, "0") == "0":
                # A test's fault comes after every rank's snapshot of its step is safe: else a
                # slow writer on a survivor, stopped with it, makes the resume a step earlier.
                resumer.settle()
                if rank == args.die_rank:
                    print(f"mscon-trainer: --die-at-step {step}: rank {rank} kills itself", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
    if resumer.writer is not None and say:
        resumer.writer.wait()
        print(f"mscon-trainer: {resumer.writer.summary()}", flush=True)
    resumer.finish(completed=True)  # finished: nothing to resume, and /dev/shm is memory
    if say:
        print(f"training finished: {step} steps, {runner.overflows} overflow(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
