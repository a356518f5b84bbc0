"""Hand-written training loops: the batches still to run, with a snapshot at every step boundary.

The docs' ``net.py`` needs three lines::

    import mscon_resume
    grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, params, has_aux=True))
    ...
    for epoch in range(10):
        i = 0
        for i, (data, label) in mscon_resume.batches(data_set, epoch, keep=(net, optimizer)):

``batches`` yields ``(index in the epoch, batch)``; resuming, the epochs already done yield
nothing and the resumed epoch starts after its last consumed batch (MindSpore's
``Dataset.set_init_step``: the pipeline skips them, in the same order as the uninterrupted run,
when the script seeds it as the docs do with ``ms.set_seed``).
"""

from __future__ import annotations

import atexit
import sys
import time
from collections.abc import Iterator
from typing import Any, Callable

from . import core
from .interval import AUTO


class Loop:
    """The state of one training loop: what it keeps and where it is."""

    def __init__(
        self,
        keep: tuple = (),
        *,
        dir: str | None = None,  # noqa: A002 - the name users pass
        every: int | str = AUTO,
        budget: float = 0.02,
        epochs: int | None = None,
    ) -> None:
        self.objects = tuple(keep)
        self.epochs = epochs
        self.core = core.Resumer(dir, every, budget)
        self.step = 0  # global steps done
        self._started = False
        self._loss: Any = None
        self._done = False

    def _start(self) -> None:
        self._started = True
        got = self.core.resume()
        if got.source == core.SNAPSHOT:
            core.load_into(self.objects, got.arrays)
            self.core.restore_rng(got)
        self.step = got.step
        self.core.keep(core.kept_parameters(*self.objects))
        self.core.ready()
        _finish_at_exit(self)

    def batches(self, dataset: Any, epoch: int) -> Iterator[tuple[int, Any]]:
        """``(i, batch)`` for the batches of epoch ``epoch`` (0-based) still to run."""
        if not self._started:
            self._start()
        size = dataset.get_dataset_size()
        first = self.step - epoch * size  # batches of this epoch already done
        if first >= size:
            return
        if first < 0:  # an epoch was left out: count from its start
            first, self.step = 0, epoch * size
        if first:
            dataset.set_init_step(first)
            batches = iter(dataset)
            dataset.set_init_step(0)  # the next epochs start at their beginning
        else:
            batches = iter(dataset)
        i = first
        # A step's time runs from the end of the one before, so it holds the batch's loading: a
        # rank with a slow loader is the slow one, not the peers that wait for it in the AllReduce
        # (which ``arrive_ts``, the time it had its batch in hand, tells the console apart).
        t0 = time.perf_counter()
        for batch in batches:
            arrive_ts = time.time()
            yield i, batch
            self._stepped(epoch, i + 1, time.perf_counter() - t0, batch, arrive_ts)
            t0 = time.perf_counter()
            i += 1
        if self.epochs is not None and epoch + 1 >= self.epochs:
            self.finish()

    def track_loss(self, fn: Callable) -> Callable:
        """``fn`` (what ``value_and_grad`` made, or any step function) reporting its loss: the
        value, or its first element (``has_aux``)."""

        def tracked(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            self._loss = _loss_of(out)
            return out

        return tracked

    def _stepped(self, epoch: int, pos: int, step_s: float, batch: Any, arrive_ts: float) -> None:
        self.step += 1
        record: dict[str, Any] = {"arrive_ts": arrive_ts}
        if self._loss is not None:
            record["loss"] = _as_float(self._loss)
            self._loss = None
        samples = _batch_size(batch)
        if samples and step_s > 0:
            record["samples_per_s"] = samples / step_s
        self.core.stepped(self.step, epoch, pos, step_s, record)

    def finish(self, completed: bool = True) -> None:
        if not self._done:
            self._done = True
            self.core.finish(completed)


def _loss_of(out: Any) -> Any:
    """The loss in what a step function returned: ``value_and_grad`` gives (value, grads), and
    with ``has_aux`` the value is (loss, aux...)."""
    value = out[0] if isinstance(out, tuple) else out
    return value[0] if isinstance(value, tuple) else value


def _as_float(value: Any) -> float | None:
    try:
        return float(value.asnumpy()) if hasattr(value, "asnumpy") else float(value)
    except (TypeError, ValueError):
        return None


def _batch_size(batch: Any) -> int | None:
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else None


_FAILED = False


def _finish_at_exit(loop: Loop) -> None:
    """At a normal exit the loop is over: its snapshots go. After an uncaught exception they stay
    (the next attempt resumes from them); a killed process runs nothing, so they stay too."""
    previous = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        global _FAILED
        _FAILED = True
        previous(kind, value, tb)

    sys.excepthook = hook
    atexit.register(lambda: loop.finish(completed=not _FAILED))


# ------------------------------------------------------------------ the module-level shape

_DEFAULT: Loop | None = None


def batches(dataset: Any, epoch: int, keep: tuple = (), **options: Any) -> Iterator[tuple[int, Any]]:
    """The script's one loop (made at the first call with ``keep`` and ``options``, as
    :class:`Loop` takes them): ``(i, batch)`` for the batches of epoch ``epoch`` still to run."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Loop(keep, **options)
    return _DEFAULT.batches(dataset, epoch)


def track_loss(fn: Callable) -> Callable:
    """``fn`` reporting its loss to the script's loop (see :meth:`Loop.track_loss`)."""

    def tracked(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if _DEFAULT is not None:
            _DEFAULT._loss = _loss_of(out)
        return out

    return tracked
