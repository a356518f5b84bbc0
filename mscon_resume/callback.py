"""``Model.train``: a Callback that snapshots at each step end and resumes the run at its last step.

::

    resume = mscon_resume.ResumeCallback(dataset)
    model.train(epochs, dataset, callbacks=[LossMonitor(), resume], initial_epoch=resume.initial_epoch)

Resuming, the callback (made before ``model.train``: all ranks at once) agrees with the other
ranks on the newest step all have, sets the dataset to start after it (``set_init_step``: the
same batches the uninterrupted run would have seen, epoch order and random augmentation
included) and gives the epoch to start in. At ``on_train_begin`` it loads the whole train network
(network, optimizer, loss-scale cell, EMA: whatever ``Model`` built) and anything passed in
``keep``, sets the step count, and puts ``LossMonitor``'s and ``ModelCheckpoint``'s own counters
(and the checkpoint file prefix) where the uninterrupted run had them.

A resume never starts at the training's last step: the step before is kept too and resumed from,
so the last step, the last validation (``Model.fit``) and the epoch-end callbacks run again, and a
run that failed after training (in an evaluation, a save) comes back to the end without the
``initial_epoch == epoch`` error. The same holds at every epoch's end (``resumable`` says why no
snapshot is taken there). Each callback is a stage of its own: two ``model.train`` calls with two
callbacks keep apart.
"""

from __future__ import annotations

import time
from typing import Any

from mindspore.train import Callback

from . import compile_cache, core, probe, resumable
from . import metrics as metrics_module
from .interval import AUTO
from .loop import stage_name
from .state import Kept, optimizer_only_ids


class ResumeCallback(Callback):
    def __init__(
        self,
        dataset: Any,
        *,
        keep: Any = (),
        name: str | None = None,
        dir: str | None = None,  # noqa: A002 - the name users pass
        every: int | str = AUTO,
        budget: float = 0.02,
    ) -> None:
        super().__init__()
        self.extra = Kept(keep)  # resolved now for its problems; again with the network at the start
        self._keep = dict(keep) if isinstance(keep, dict) else {f"keep[{i}]": v for i, v in enumerate(keep)}
        self.name = name or stage_name("callback")
        self.core = core.Resumer(dir, every, budget, metrics=metrics_module.shared(), stage=self.name)
        self.core.resumable = resumable.at_callback_step
        self.dataset = dataset
        self.size = int(dataset.get_dataset_size()) or 1
        # A collective when resuming: every rank makes its callback. Never at an epoch's end (the
        # module docstring says why).
        self.got = self.core.resume(problems=self.extra.problems, accept=_not_an_epoch_end)
        # After the resume's collective: Model.train's graphs are kept and loaded by every attempt.
        compile_cache.enable(self.core.rank, self.core.size, trains_cells=True)
        self.core.drop_at_success()
        self.initial_epoch = 0
        self._fast: bool | None = None  # MindSpore's fast recovery, off until Model has its iterator
        if self.got.step:
            self.initial_epoch = self.got.step // self.size
            self._fast = _replay_exactly()
            dataset.set_init_step(self.got.step)
        self.kept: Kept | None = None
        self._t0 = 0.0
        self._end: float | None = None  # when the step before ended (a step's time holds its load)
        self._arrive_ts = 0.0
        self._probe: probe.Unkept | None = None
        self._local = 0
        self._train_network: Any = None
        self._optimizer_ids: set[int] | None = None

    def on_train_begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        self.dataset.set_init_step(0)  # the iterator has taken it: a later eval on the dataset starts at 0
        if self._fast is not None:
            from mindspore.dataset import config

            config.set_fast_recovery(self._fast)
        self._train_network = cb.train_network
        self.kept = Kept({"net": cb.train_network, **self._keep})
        self.core.kept = self.kept
        self.core.extra["total"] = (int(cb.epoch_num) + self.initial_epoch) * int(cb.batch_num)
        self.core.extra["per_epoch"] = int(cb.batch_num)
        if self.got.source == core.SNAPSHOT:
            self.core.restore(self.got)
        if self.got.step:
            cb.cur_step_num = self.got.step
            _align_callbacks(cb, self.got.step, self.got.meta.get("checkpoint_prefixes"))
        self.core.extra["checkpoint_prefixes"] = _checkpoint_prefixes(cb)
        self.core.keep(self.kept.params)
        for problem in self.kept.problems:  # said now, and refused on a relaunch
            self.core.note(problem)
        self.core.warn(probe.unrepeatable_cells(cb.train_network))
        self._probe = probe.Unkept(self.kept.ids)
        probe.watch_set_data(self._watched_ids, self.core.note)
        self.core.ready()

    def _watched_ids(self) -> set[int]:
        if not self._local or self._train_network is None:
            return set()
        if self._optimizer_ids is None:
            self._optimizer_ids = optimizer_only_ids((self._train_network,))
        return self._optimizer_ids

    def on_train_step_begin(self, run_context: Any) -> None:
        # Model.train fetched the batch already: from the step before's end, so a rank with a
        # slow loader is the slow one, not its peers waiting in the AllReduce (loop.py says more).
        self._arrive_ts = time.time()
        self._t0 = self._end if self._end is not None else time.perf_counter()

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        dt = time.perf_counter() - self._t0
        step = int(cb.cur_step_num)
        per_epoch = int(cb.batch_num) or 1
        self._local += 1
        if self._probe is not None and self._probe.stepped(self._local, self.core.note):
            self._probe = None
        record: dict[str, Any] = {"arrive_ts": self._arrive_ts}
        loss = _loss(cb.net_outputs)
        if loss is not None:
            record["loss"] = loss
        batch = getattr(cb, "train_dataset_element", None)
        shape = getattr(batch[0], "shape", None) if isinstance(batch, (tuple, list)) and batch else None
        if shape and dt > 0:
            record["samples_per_s"] = int(shape[0]) / dt
        epoch, pos = (step - 1) // per_epoch, (step - 1) % per_epoch + 1
        self.core.stepped(step, epoch, pos, dt, record)
        last = step == self.core.extra.get("total", 0) - 1 or (per_epoch > 1 and pos == per_epoch - 1)
        if last and not self.core.due(step, pos):
            self.core.snapshot(step, epoch, pos)  # an epoch's end resumes from the step before
        self._end = time.perf_counter()

    def on_train_end(self, run_context: Any) -> None:
        # Snapshots stay until the whole run has succeeded: a fault after training (an
        # evaluation, a save) resumes to the end rather than training again.
        if self.core.writer is not None:
            self.core.writer.wait()
        if self.kept is not None:
            self.core.metrics.final(
                self.name, int(run_context.original_args().cur_step_num), self.kept.digests()
            )


def _not_an_epoch_end(snap: Any) -> bool:
    return resumable.at_callback_step(snap.step, snap.meta.get("pos"), snap.meta)


def _replay_exactly() -> bool:
    """Fast recovery off, so the skipped batches go through the whole pipeline and random
    augmentation draws as before (``loop._iterator`` says more); returns the setting it had."""
    from mindspore.dataset import config

    fast = bool(config.get_fast_recovery())
    config.set_fast_recovery(False)
    return fast


def _checkpoint_prefixes(cb: Any) -> list[str]:
    return [
        c._prefix for c in _callbacks(cb, "ModelCheckpoint") if isinstance(getattr(c, "_prefix", None), str)
    ]


def _callbacks(cb: Any, kind: str) -> list[Any]:
    return [c for c in getattr(cb, "list_callback", []) or [] if type(c).__name__ == kind]


def _align_callbacks(cb: Any, step: int, prefixes: Any) -> None:
    """MindSpore's own callbacks count from their construction; resumed at ``step``, they count
    as in the uninterrupted run: the same steps printed and saved, under the same file names
    (a checkpoint folder with the first launch's files in it made ModelCheckpoint pick another
    prefix)."""
    for monitor in _callbacks(cb, "LossMonitor"):
        per = int(getattr(monitor, "_per_print_times", 0) or 0)
        if per:
            monitor._last_print_time = (step // per) * per
    saved = list(prefixes) if isinstance(prefixes, list) else []
    for i, ckpt in enumerate(_callbacks(cb, "ModelCheckpoint")):
        config = getattr(ckpt, "_config", None)
        every = int(getattr(config, "save_checkpoint_steps", 0) or 0)
        if every:
            ckpt._last_triggered_step = (step // every) * every
        if i < len(saved) and isinstance(saved[i], str) and getattr(ckpt, "_prefix_func", None) is None:
            ckpt._prefix = saved[i]


def _loss(outputs: Any) -> float | None:
    value = outputs[0] if isinstance(outputs, (tuple, list)) and outputs else outputs
    try:
        return float(value.asnumpy()) if hasattr(value, "asnumpy") else float(value)
    except (TypeError, ValueError):
        return None
