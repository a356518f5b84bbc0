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
``Dataset.set_init_step``, replayed through the whole pipeline so that random augmentation draws
what it drew before). ``epochs(n)`` yields only the epochs still to run, so code around the batch
loop (a learning-rate decay at each epoch's end, a permutation drawn at each epoch's start) runs
as it did; without it such code runs again for the skipped epochs, which is found and refused.

A script may have several loops (a training stage, then a fine-tuning stage): each is a stage
with its own snapshots; a stage that ran to its end is skipped on relaunch, its state restored.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any, Callable

from . import carried, core, env, lifecycle, probe, rng
from . import metrics as metrics_module
from .interval import AUTO
from .state import Kept, optimizer_only_ids

_NAMES: dict[str, itertools.count] = {}
OUTSIDE_CODE = (
    "code outside the batch loop changed the kept or random state in the epochs the resume skips (a "
    "learning-rate decay or a draw at each epoch) and would run again: loop over mscon_resume.epochs(N)"
)


def stage_name(kind: str) -> str:
    """The next stage of this kind in the script: the same on every launch of the same script."""
    return f"{kind}{next(_NAMES.setdefault(kind, itertools.count()))}"


class Loop:
    """The state of one training loop (a stage of the script): what it keeps and where it is."""

    def __init__(
        self,
        keep: Any = (),
        *,
        name: str | None = None,
        dir: str | None = None,  # noqa: A002 - the name users pass
        every: int | str = AUTO,
        budget: float = 0.02,
        epochs: int | None = None,
    ) -> None:
        self.keep = keep
        self.kept = Kept(keep)
        self.name = name or stage_name("loop")
        self.epochs_total = epochs
        self.core = core.Resumer(dir, every, budget, metrics=metrics_module.shared(), stage=self.name)
        self.core.kept = self.kept
        self.step = 0  # global steps done
        self.dataset: Any = None
        self._started = False
        self._loss: Any = None
        self._done = False
        self._got: core.Resumed | None = None  # the snapshot resumed from, until its epoch begins
        self._restored: str | None = None  # the state's digest as restored: code that changes it
        self._probe: probe.Unkept | None = None
        self._local = 0  # steps this launch
        self._epoch = 0  # the epoch batches() was last asked for
        self._last_epoch = -1  # the same, as the module-level batches() tells stages apart
        self._by_epochs = False  # made by the module-level epochs()
        self._optimizer_ids: set[int] | None = None  # what a set_data must not touch once stepped
        atexit.register(self._at_exit)

    # ------------------------------------------------------------------ start and restore

    def _start(self) -> None:
        self._started = True
        got = self.core.resume(problems=self.kept.problems, announce=False)
        self.core.keep(self.kept.params)
        self.core.drop_at_success()
        self.step = got.step
        if got.source == core.SNAPSHOT:
            self.core.restore(got)
            self._got = got
            if got.done:
                self.core.say(
                    f"rank {self.core.rank}: {self.name} ran to its end before; skipped, its state restored"
                )
            else:
                self._announce(got)
        elif got.step:
            self._announce(got)
        elif env.resuming():
            self.core.say(f"rank {self.core.rank}: no state every rank has; starting from the beginning")
        for problem in self.kept.problems:  # said now, and refused on a relaunch
            self.core.note(problem)
        self.core.warn(probe.unrepeatable_cells(self.keep))
        self._probe = probe.Unkept(self.kept.ids)
        self.core.carrier = carried.Carrier(self.keep, lambda: self.kept.ids, self.core.note)
        probe.watch_set_data(self._watched_ids, self.core.note)
        self.core.ready()

    def _watched_ids(self) -> set[int]:
        """The optimizers' own parameters once this launch has stepped (before: a restore's own
        writes; a weight or an EMA's shadow that eager ops read sees a set_data)."""
        if not self._local or self._done:
            return set()
        if self._optimizer_ids is None:
            self._optimizer_ids = optimizer_only_ids(self.keep)
        return self._optimizer_ids

    def _announce(self, got: core.Resumed) -> None:
        saved = time.strftime("%H:%M:%S", time.localtime(got.meta.get("saved_at", time.time())))
        where = f"snapshot saved {saved}" if got.source == core.SNAPSHOT else got.source
        self.core.say(f"rank {self.core.rank} resumes after step {got.step} ({where})")

    def _digest(self) -> str:
        """The kept state and the random state, digested (code outside the batch loop that
        changes either between the restore and the resumed epoch would be run twice)."""
        parts = self.kept.digests()
        meta, arrays = rng.capture()
        h = hashlib.sha256(json.dumps([parts, meta], sort_keys=True, default=str).encode())
        for name in sorted(arrays):
            h.update(arrays[name].tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------------ epochs and batches

    def epochs(self, n: int) -> Iterator[int]:
        """The epochs still to run, of ``n``: code around the batch loop runs for those only."""
        if not self._started:
            self._start()
        got = self._got
        if got is not None and got.done:
            self._got = None
            self._put_back_carried(got)  # as the loop left them: the code after it sees them
            return
        first = 0
        if got is not None:
            first = int(got.meta.get("epoch", 0))
            epoch_rng = got.meta.get("epoch_rng")
            if epoch_rng is not None:  # the epoch's start code draws what it drew before
                rng.restore({"rng": epoch_rng}, got.arrays, rng.EPOCH)
        for epoch in range(first, n):
            if got is None or epoch != first:
                meta, arrays = rng.capture(rng.EPOCH)
                self.core.extra["epoch_rng"] = meta
                self.core.extra_arrays = arrays
            yield epoch
        self._finish_stage()

    def batches(self, dataset: Any, epoch: int) -> Iterator[tuple[int, Any]]:
        """``(i, batch)`` for the batches of epoch ``epoch`` (0-based) still to run."""
        if not hasattr(dataset, "get_dataset_size") or not hasattr(dataset, "set_init_step"):
            raise TypeError(
                f"mscon_resume.batches takes a MindSpore dataset, not a {type(dataset).__name__}: pass the "
                "dataset itself, not create_tuple_iterator() or create_dict_iterator()"
            )
        self.dataset = dataset
        self._epoch = epoch
        if not self._started:
            self._start()
            got = self._got
            if got is not None and (got.done or int(got.meta.get("epoch", 0)) > epoch):
                self._restored = self._digest()  # epochs before the resumed one are skipped
        size = dataset.get_dataset_size()
        got = self._got
        if got is not None and got.done:
            self._put_back_carried(got)  # each epoch's end code runs on them as it did
            return
        if got is not None and epoch >= int(got.meta.get("epoch", 0)):
            # The resumed epoch, even when the snapshot was its last step (no batch left, its
            # end code still to run): the state as restored, then put back where the snapshot was.
            self._resumed_epoch_begins()
        first = self.step - epoch * size  # batches of this epoch already done
        if first >= size:
            return
        if first < 0:  # an epoch was left out: count from its start
            first, self.step = 0, epoch * size
        yield from self._iterate(dataset, epoch, first)
        if self.epochs_total is not None and epoch + 1 >= self.epochs_total:
            self._finish_stage()

    def _resumed_epoch_begins(self) -> None:
        """The first batches of this launch: the state must be as restored, then the kept state
        and the random state are put back as they were at the snapshot (the epoch's start code,
        under ``epochs``, drew from the epoch's own random state)."""
        got, self._got = self._got, None
        if self._restored is not None:
            restored, self._restored = self._restored, None
            if self._digest() != restored:
                self.core.refuse(OUTSIDE_CODE)
        if got is not None and got.meta.get("epoch_rng") is not None:
            self.core.restore(got)
        if got is not None:
            self._put_back_carried(got)

    def _put_back_carried(self, got: core.Resumed) -> None:
        """The values the script's loops carry, as they were at the snapshot: after the epoch's
        start code ran again (``total = 0``), before the resumed epoch's first batch."""
        if self.core.carrier is not None and got.meta.get("carried"):
            self.core.carrier.restore(got.meta["carried"], got.arrays)

    def _iterate(self, dataset: Any, epoch: int, first: int) -> Iterator[tuple[int, Any]]:
        before: str | None = probe.global_random_digest()
        batches = _iterator(dataset, first)
        i = first
        # A step's time runs from the end of the one before, so it holds the batch's loading: a
        # rank with a slow loader is the slow one, not the peers that wait for it in the AllReduce
        # (which ``arrive_ts``, the time it had its batch in hand, tells the console apart).
        t0 = time.perf_counter()
        for batch in batches:
            if before is not None:  # nothing of the script ran since the pipeline began
                if probe.global_random_digest() != before:
                    self.core.note(probe.PIPELINE_DRAWS)
                before = None
            arrive_ts = time.time()
            yield i, batch
            self._stepped(epoch, i + 1, time.perf_counter() - t0, batch, arrive_ts)
            t0 = time.perf_counter()
            i += 1

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
        self._local += 1
        if self._probe is not None and self._probe.stepped(self._local, self.core.note):
            self._probe = None
        record: dict[str, Any] = {"arrive_ts": arrive_ts}
        if self._loss is not None:
            record["loss"] = _as_float(self._loss)
            self._loss = None
        samples = _batch_size(batch)
        if samples and step_s > 0:
            record["samples_per_s"] = samples / step_s
        self.core.stepped(self.step, epoch, pos, step_s, record)

    # ------------------------------------------------------------------ the end of a stage

    def _finish_stage(self) -> None:
        """The stage ran to its end: its last state kept as done (a relaunch skips the stage),
        and a digest of every kept object in the metrics for comparisons."""
        if self._done or not self._started:
            return
        self._done = True
        if self._restored is not None and self._digest() != self._restored:
            self.core.refuse(OUTSIDE_CODE)
        self._restored = None
        self.core.snapshot(self.step, self._epoch, 0, done=True)
        if self.core.writer is not None:
            self.core.writer.wait()
        self.core.metrics.final(self.name, self.step, self.kept.digests())

    def finish(self, completed: bool = True) -> None:
        if completed:
            self._finish_stage()
        self._done = True
        self.core.finish(completed=False)

    def _at_exit(self) -> None:
        """The interpreter ends: the last stage's digest for comparisons, the last write awaited."""
        if self._started and not self._done and not lifecycle.has_failed():
            self._done = True
            try:
                self.core.metrics.final(self.name, self.step, self.kept.digests())
            except Exception:  # noqa: BLE001 - MindSpore torn down: the digest is a comparison aid only
                pass
        if self.core.writer is not None:
            self.core.writer.wait()


def _iterator(dataset: Any, first: int) -> Any:
    """The epoch's batches from batch ``first`` on: the skipped ones go through the whole
    pipeline (``fast_recovery`` off), so random augmentation draws as the uninterrupted run did."""
    if not first:
        return iter(dataset)
    from mindspore.dataset import config

    fast = config.get_fast_recovery()
    config.set_fast_recovery(False)
    try:
        dataset.set_init_step(first)
        batches = iter(dataset)
        dataset.set_init_step(0)  # the next epochs, and other users of the dataset, start at the beginning
    finally:
        config.set_fast_recovery(fast)
    return batches


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


# ------------------------------------------------------------------ the module-level shape

_DEFAULT: Loop | None = None


def _loop_for(epoch: int, keep: Any, options: dict) -> Loop:
    """The script's current loop, or a new stage: epochs counted from the start again, or another
    ``keep``, begin one (the one before has run to its end). A dataset made anew each epoch is the
    same loop; a loop under :func:`epochs` is one stage whatever its batches() calls say."""
    global _DEFAULT
    cur = _DEFAULT
    if cur is not None and not cur._done and cur._by_epochs:
        return cur
    new = (
        cur is None
        or cur._done
        or epoch < cur._last_epoch
        or bool(keep and keep is not cur.keep and Kept(keep).ids != cur.kept.ids)
    )
    if new:
        if cur is not None:
            cur.finish(completed=True)
        _DEFAULT = cur = Loop(keep, **options)
    cur._last_epoch = epoch
    return cur


def batches(dataset: Any, epoch: int, keep: Any = (), **options: Any) -> Iterator[tuple[int, Any]]:
    """The script's loop (made at the first call with ``keep`` and ``options``, as :class:`Loop`
    takes them; a new stage when another loop begins): ``(i, batch)`` for the batches of epoch
    ``epoch`` still to run."""
    return _loop_for(epoch, keep, options).batches(dataset, epoch)


def epochs(n: int, keep: Any = (), **options: Any) -> Iterator[int]:
    """``for epoch in mscon_resume.epochs(n, keep=...)``: the script's loop's epochs still to run
    (a new stage each time it is called); ``batches(dataset, epoch)`` inside."""
    global _DEFAULT
    if _DEFAULT is not None and not _DEFAULT._done:
        _DEFAULT.finish(completed=True)
    _DEFAULT = Loop(keep, **options)
    _DEFAULT._by_epochs = True  # its epochs come from epochs(): batches() inside never starts another stage
    return _DEFAULT.epochs(n)


def track_loss(fn: Callable) -> Callable:
    """``fn`` reporting its loss to the script's loop (see :meth:`Loop.track_loss`)."""

    def tracked(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if _DEFAULT is not None:
            _DEFAULT._loss = _loss_of(out)
        return out

    return tracked
