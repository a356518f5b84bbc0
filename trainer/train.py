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

from trainer import checkpoint  # noqa: E402
from trainer.config import Cluster, cluster_from_env, fail, parse_args  # noqa: E402
from trainer.metrics import MetricsWriter, param_checksum  # noqa: E402


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
    """semi_auto_parallel for the MLP: fc1 splits its output features over the model axis
    (data x model), fc2 reduces over it; MindSpore inserts the collectives. nn.Dense multiplies by
    its (out, in) weight with transpose_b, so a weight's strategy is written (out split, in split)."""
    dp, mp = strategy
    net.fc1.matmul.shard(((dp, 1), (mp, 1)))
    net.fc2.matmul.shard(((dp, mp), (1, mp)))


class StepRunner:
    """One optimizer update = ``accum`` micro-batches: forward+backward each (compiled), sum the
    gradients, then one AllReduce, unscale, overflow check and update (compiled)."""

    def __init__(self, ms: Any, net: Any, loss_fn: Any, opt: Any, size: int, args: Any) -> None:
        from mindspore import nn

        self.ms = ms
        self.accum = args.grad_accum
        if args.loss_scale == "dynamic":
            self.scaler = ms.amp.DynamicLossScaler(args.loss_scale_value, 2, 1000)
        else:
            self.scaler = ms.amp.StaticLossScaler(
                args.loss_scale_value if args.loss_scale == "fixed" else 1.0
            )
        scaler, accum = self.scaler, float(args.grad_accum)

        def forward(x: Any, y: Any) -> Any:
            loss = loss_fn(net(x), y)
            return scaler.scale(loss), loss  # gradients of the scaled loss; the plain one is reported

        grad_fn = ms.value_and_grad(forward, None, opt.parameters, has_aux=True)
        reducer = nn.DistributedGradReducer(opt.parameters, True, size) if size > 1 else None

        @ms.jit
        def micro(x: Any, y: Any) -> Any:
            return grad_fn(x, y)

        @ms.jit
        def add(total: Any, grads: Any) -> Any:
            # MindSpore's graph syntax has no zip(strict=); both tuples come from the same grad_fn.
            return tuple(t + g for t, g in zip(total, grads))  # noqa: B905

        @ms.jit
        def update(grads: Any) -> Any:
            if reducer is not None:
                grads = reducer(grads)  # once per update: accumulation also saves communication
            grads = scaler.unscale(grads)
            grads = tuple(g / accum for g in grads)
            finite = ms.amp.all_finite(grads)
            scaler.adjust(finite)
            if finite:
                opt(grads)
            return finite

        self._micro, self._add, self._update = micro, add, update
        self.overflows = 0

    @property
    def loss_scale(self) -> float:
        return float(self.scaler.scale_value.asnumpy())

    def step(self, batches: list[tuple[Any, Any]]) -> tuple[float, bool]:
        """(mean unscaled loss, overflowed) for one update."""
        total = None
        losses = 0.0
        for x, y in batches:
            (_, loss), grads = self._micro(x, y)
            losses += float(loss.asnumpy())
            # mutable(): a plain tuple argument is a compile-time constant to ms.jit, so every step
            # would compile a new graph (measured: ~0.5 s a step instead of ~2 ms).
            total = grads if total is None else self._add(self.ms.mutable(total), self.ms.mutable(grads))
        finite = bool(self._update(self.ms.mutable(total)).asnumpy())
        if not finite:
            self.overflows += 1
        return losses / len(batches), not finite


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


def train_sharded(
    ms: Any,
    args: Any,
    net: Any,
    loss_fn: Any,
    opt: Any,
    source: Any,
    batch: int,
    size: int,
    rank: int,
    say: bool,
) -> int:
    """semi_auto/auto/hybrid parallel: the whole step must be one graph that MindSpore shards, so it
    goes through ``Model.train`` (GPU/Ascend only; not exercised on CPU, which refuses these modes)."""
    from mindspore.train import Callback

    from trainer import data

    if args.grad_accum > 1:
        fail(f"--grad-accum with --parallel-mode {args.parallel_mode} is not supported by this trainer")
    metrics = MetricsWriter(os.environ.get("MSCON_METRICS"))

    class Report(Callback):
        def on_train_step_begin(self, run_context: Any) -> None:
            self.t0 = time.perf_counter()

        def on_train_step_end(self, run_context: Any) -> None:
            cb = run_context.original_args()
            dt = time.perf_counter() - self.t0
            loss = float(cb.net_outputs.asnumpy().mean())
            in_epoch = (cb.cur_step_num - 1) % cb.batch_num + 1
            if say:
                print(f"epoch: {cb.cur_epoch_num} step: {in_epoch}, loss is {loss:.6f}", flush=True)
            metrics.write(
                {"step": cb.cur_step_num, "epoch": cb.cur_epoch_num, "loss": loss, "step_time_s": dt}
            )

    dataset = data.make_dataset(source, batch, size, rank, 0, args.seed, args.sampler)
    model = ms.Model(net, loss_fn, opt)
    model.train(args.epochs, dataset, callbacks=[Report()], dataset_sink_mode=False)
    metrics.close()
    if say:
        print("training finished", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    cluster = cluster_from_env()
    args = parse_args(argv, cluster)
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings drown the loss lines
    if cluster.is_scheduler:
        return run_scheduler(cluster)

    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init

    from trainer import data, models

    device_id = os.environ.get("DEVICE_ID")  # unset under msrun: MindSpore picks per rank
    ms.set_device(args.device_target, int(device_id) if device_id else None)
    ms.set_context(mode=ms.GRAPH_MODE if args.exec_mode == "graph" else ms.PYNATIVE_MODE)
    rank, size = 0, 1
    if cluster.in_cluster:
        init()
        rank, size = get_rank(), get_group_size()
    if size != cluster.size:
        fail(f"the cluster has {size} ranks but the launcher announced {cluster.size}")
    configure_parallel(ms, args, size)
    ms.set_seed(args.seed)  # identical initial weights and data order on every rank (seed 003)
    say = rank == 0 or not args.log_rank0_only
    if say:
        print(
            f"mscon-trainer rank {rank}/{size} device {args.device_target} mode {args.parallel_mode} "
            f"model {args.model} amp {args.amp_level} accum {args.grad_accum}",
            flush=True,
        )

    micro_batch = args.batch_size // (size * args.grad_accum)
    synthetic = args.dataset == "synthetic"
    shape = {
        "synthetic": models.input_shape(args.model, None),
        "imagefolder": (3, args.image_size, args.image_size),
    }.get(args.dataset)
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
    features = math.prod(source.sample_shape) if args.model == "mlp" else None
    in_channels = source.sample_shape[0] if len(source.sample_shape) == 3 else 1
    net = models.build_model(args.model, source.num_classes, in_channels=in_channels, features=features)
    if args.recompute:
        for cell in net.cells():
            cell.recompute()
    if args.amp_level != "O0":
        net = ms.amp.auto_mixed_precision(net, args.amp_level)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), args.lr, args.momentum, weight_decay=args.weight_decay)
    if args.parallel_mode in ("semi_auto_parallel", "auto_parallel", "hybrid_parallel"):
        if args.parallel_mode == "semi_auto_parallel":
            apply_strategy(net, args.strategy)
        return train_sharded(ms, args, net, loss_fn, opt, source, micro_batch, size, rank, say)
    runner = StepRunner(ms, net, loss_fn, opt, size, args)

    per_epoch_batches = len(source) // (size * micro_batch)
    steps_per_epoch = min(args.steps_per_epoch, per_epoch_batches // args.grad_accum)
    if steps_per_epoch < 1:
        fail(
            f"{len(source)} samples are too few for {size} rank(s) x batch {micro_batch} "
            f"x accum {args.grad_accum}"
        )
    total_steps = args.epochs * steps_per_epoch
    start = 0
    if args.resume:
        start = checkpoint.agree_on_step(args.checkpoint_dir, rank, size, args.checkpoint_every, total_steps)
        if start:
            meta = checkpoint.load(args.checkpoint_dir, rank, start, net, opt)
            if say:
                saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta.get("saved_at", 0)))
                print(f"mscon-trainer: resumed from step {start} (checkpoint saved {saved})", flush=True)
        elif say:
            print("mscon-trainer: no checkpoint every rank has; starting from step 0", flush=True)

    metrics = MetricsWriter(os.environ.get("MSCON_METRICS"))
    profiling = Profiling(args.profile_steps, args.profile_dir, rank)
    step = start
    for epoch in range(start // steps_per_epoch, args.epochs):
        dataset = data.make_dataset(source, micro_batch, size, rank, epoch, args.seed, args.sampler)
        batches = dataset.create_tuple_iterator(num_epochs=1)
        skip = (step - epoch * steps_per_epoch) * args.grad_accum  # resuming mid-epoch
        for _ in range(skip):
            next(batches)
        while step < (epoch + 1) * steps_per_epoch:
            profiling.before(step + 1)
            t0 = time.perf_counter()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            loss, overflow = runner.step([next(batches) for _ in range(args.grad_accum)])
            dt = time.perf_counter() - t0
            step += 1
            in_epoch = step - epoch * steps_per_epoch
            if say:
                print(f"epoch: {epoch + 1} step: {in_epoch}, loss is {loss:.6f}", flush=True)
            record: dict[str, Any] = {
                "step": step,
                "epoch": epoch + 1,
                "loss": loss,
                "step_time_s": dt,
                "samples_per_s": micro_batch * args.grad_accum / dt if dt > 0 else None,
                "loss_scale": runner.loss_scale,
                "overflow": overflow,
                "overflow_count": runner.overflows,
                "device_memory_bytes": device_memory(ms),
            }
            if step % args.checksum_every == 0 or step == total_steps:
                record["param_checksum"] = param_checksum(net)
            profile_dir = profiling.after(step)
            if profile_dir:
                record["profile_dir"] = profile_dir
            metrics.write(record)
            if args.checkpoint_dir and (step % args.checkpoint_every == 0):
                saved = net.get_parameters()
                params = [{"name": p.name, "data": p} for p in saved]
                params += [
                    {"name": p.name, "data": p} for p in opt.get_parameters() if p.name.startswith("moment")
                ]
                checkpoint.save(
                    args.checkpoint_dir, rank, step, params, {"epoch": epoch + 1}, args.keep_checkpoints
                )
            if args.die_at_step == step and rank == args.die_rank:
                print(f"mscon-trainer: --die-at-step {step}: rank {rank} kills itself", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    metrics.close()
    if say:
        print(f"training finished: {step} steps, {runner.overflows} overflow(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
