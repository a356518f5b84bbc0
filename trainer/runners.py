"""The two ways the trainer takes one optimizer update; the training loop is the same for both.

- ``CellRunner`` (the default): the whole update is one ``TrainOneStepWithLossScaleCell`` graph,
  what ``Model.train`` builds. MindSpore can only shard a step it compiles as one graph, so
  semi_auto/auto/hybrid parallel need it; on CPU it runs stand_alone and data_parallel.
- ``FunctionalRunner`` (stand_alone, data_parallel with ``--grad-accum`` > 1): value_and_grad
  pieces compiled separately, so accumulation can sum micro-batches before the one AllReduce.
"""

from __future__ import annotations

from typing import Any

RUNNERS = ("auto", "functional", "cell")
SHARDED_MODES = ("semi_auto_parallel", "auto_parallel", "hybrid_parallel")


def choose(runner: str, mode: str, grad_accum: int) -> str:
    """The runner for ``mode``; ``ValueError`` names a combination that cannot work.

    ``auto`` takes the cell runner unless gradients are accumulated: one graph per step is about
    2x the samples/s of the functional pieces on CPU (bench/trainer.py --runner, README).
    """
    if runner == "auto":
        runner = "functional" if grad_accum > 1 and mode not in SHARDED_MODES else "cell"
    if runner == "functional" and mode in SHARDED_MODES:
        raise ValueError(f"--runner functional cannot shard a step; {mode} needs --runner cell (or auto)")
    if runner == "cell" and grad_accum > 1:
        why = f"; {mode} cannot use it" if mode in SHARDED_MODES else ""
        raise ValueError(f"--grad-accum needs --runner functional{why}")
    return runner


class FunctionalRunner:
    """One optimizer update = ``accum`` micro-batches: forward+backward each (compiled), sum the
    gradients, then one AllReduce, unscale, overflow check and update (compiled)."""

    def __init__(self, ms: Any, net: Any, loss_fn: Any, opt: Any, size: int, args: Any) -> None:
        from mindspore import nn

        self.ms, self.net, self.opt = ms, net, opt
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

    def checkpoint_payload(self) -> Any:
        """What a checkpoint holds: the weights and the Momentum state."""
        params = [{"name": p.name, "data": p} for p in self.net.get_parameters()]
        moments = [p for p in self.opt.get_parameters() if p.name.startswith("moment")]
        return params + [{"name": p.name, "data": p} for p in moments]

    def restore(self, params: dict[str, Any]) -> None:
        self.ms.load_param_into_net(self.net, params)
        self.ms.load_param_into_net(self.opt, params)


class CellRunner:
    """One update = one call of a compiled ``TrainOneStepWithLossScaleCell`` (forward, backward,
    gradient reduction where the mode needs it, unscale, overflow check, update).

    Checkpoints save that cell: in semi/auto parallel ``save_checkpoint`` gathers every sharded
    parameter into its full shape (integrated_save), so a resumed run loads full tensors before its
    first compile and MindSpore slices them for whatever strategy the run uses.
    """

    def __init__(self, ms: Any, net: Any, loss_fn: Any, opt: Any, size: int, args: Any) -> None:
        from mindspore import nn

        self.ms = ms  # --grad-accum > 1 never gets here: choose() sends it to the functional runner
        if args.loss_scale == "dynamic":
            sense: Any = nn.DynamicLossScaleUpdateCell(args.loss_scale_value, 2, 1000)
        else:
            value = args.loss_scale_value if args.loss_scale == "fixed" else 1.0
            sense = ms.Tensor(value, ms.float32)
        self.cell = _train_step_class(ms)(nn.WithLossCell(net, loss_fn), opt, scale_sense=sense)
        self.cell.set_train()
        self.overflows = 0

    @property
    def loss_scale(self) -> float:
        return float(self.cell.scale_sense.asnumpy())

    def step(self, batches: list[tuple[Any, Any]]) -> tuple[float, bool]:
        ((x, y),) = batches
        loss, overflow, _ = self.cell(x, y)
        overflowed = bool(overflow.asnumpy())
        if overflowed:
            self.overflows += 1
        return float(loss.asnumpy()), overflowed

    def checkpoint_payload(self) -> Any:
        return self.cell

    def restore(self, params: dict[str, Any]) -> None:
        self.ms.load_param_into_net(self.cell, params)


def _train_step_class(ms: Any) -> Any:
    """MindSpore's TrainOneStepWithLossScaleCell, whose overflow check knows GPU and Ascend only (on
    CPU it calls status ops CPU lacks); on CPU every gradient is checked with ``all_finite``."""
    from mindspore import nn

    if ms.get_context("device_target") != "CPU":
        return nn.TrainOneStepWithLossScaleCell

    class CpuTrainStep(nn.TrainOneStepWithLossScaleCell):
        def get_overflow_status(self, status: Any, compute_output: Any) -> Any:
            # The gradients are already reduced over the ranks, so every rank reaches the same answer.
            return ms.ops.logical_not(ms.amp.all_finite(compute_output))

    return CpuTrainStep


def make_runner(
    kind: str, ms: Any, net: Any, loss_fn: Any, opt: Any, size: int, args: Any
) -> FunctionalRunner | CellRunner:
    cls = CellRunner if kind == "cell" else FunctionalRunner
    return cls(ms, net, loss_fn, opt, size, args)
