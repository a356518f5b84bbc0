"""``Model.train``: a Callback that snapshots at each step end and resumes the run at its last step.

::

    resume = mscon_resume.ResumeCallback(dataset)
    model.train(epochs, dataset, callbacks=[LossMonitor(), resume], initial_epoch=resume.initial_epoch)

Resuming, the callback (made before ``model.train``: all ranks at once) agrees with the other
ranks on the newest step all have, sets the dataset to start after it (``set_init_step``: the
same batches the uninterrupted run would have seen, epoch order included) and gives the epoch to
start in; at ``on_train_begin`` it loads the network's and optimizer's state and sets the step
count, so LossMonitor and ModelCheckpoint count on from there.
"""

from __future__ import annotations

import time
from typing import Any

from mindspore.train import Callback

from . import core
from .interval import AUTO


class ResumeCallback(Callback):
    def __init__(
        self,
        dataset: Any,
        *,
        dir: str | None = None,  # noqa: A002 - the name users pass
        every: int | str = AUTO,
        budget: float = 0.02,
    ) -> None:
        super().__init__()
        self.core = core.Resumer(dir, every, budget)
        self.got = self.core.resume()  # a collective when resuming: every rank makes its callback
        self.initial_epoch = 0
        if self.got.step:
            self.initial_epoch = self.got.step // dataset.get_dataset_size()
            dataset.set_init_step(self.got.step)
        self._t0 = 0.0
        self._end: float | None = None  # when the step before ended (a step's time holds its load)
        self._arrive_ts = 0.0

    def on_train_begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        net = cb.train_network
        if self.got.source == core.SNAPSHOT:
            core.load_into((net,), self.got.arrays)
            self.core.restore_rng(self.got)
        if self.got.step:
            cb.cur_step_num = self.got.step
        self.core.keep(core.kept_parameters(net))
        self.core.ready()

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
        record: dict[str, Any] = {"arrive_ts": self._arrive_ts}
        loss = _loss(cb.net_outputs)
        if loss is not None:
            record["loss"] = loss
        batch = getattr(cb, "train_dataset_element", None)
        shape = getattr(batch[0], "shape", None) if isinstance(batch, (tuple, list)) and batch else None
        if shape and dt > 0:
            record["samples_per_s"] = int(shape[0]) / dt
        self.core.stepped(step, (step - 1) // per_epoch, (step - 1) % per_epoch + 1, dt, record)
        self._end = time.perf_counter()

    def on_train_end(self, run_context: Any) -> None:
        self.core.finish(completed=True)


def _loss(outputs: Any) -> float | None:
    value = outputs[0] if isinstance(outputs, (tuple, list)) and outputs else outputs
    try:
        return float(value.asnumpy()) if hasattr(value, "asnumpy") else float(value)
    except (TypeError, ValueError):
        return None
