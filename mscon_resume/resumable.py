"""Steps a ``Model.train`` callback can resume at; the same rule says where it takes no snapshot.

A resume never starts at an epoch's last step: the step before is resumed from, so the epoch's
last step and its end (a validation, a best-model checkpoint, an epoch's callbacks: a fault in
them would otherwise skip them) run again; and never at the training's last step
(``Model.train`` refuses an ``initial_epoch`` equal to its ``epoch``), so the last validation and
everything after it run again.

No snapshot is taken at such a step: each rank keeps its ``store.KEEP`` newest, and a rank one
step ahead of a killed one would otherwise hold an epoch's end and the step after it, and no
longer the step before the end that the killed rank's newest usable snapshot is (CI saw both
ranks start over that way).
"""

from __future__ import annotations

from typing import Any


def at_callback_step(step: int, pos: Any, meta: dict[str, Any]) -> bool:
    """``pos``: batches of the epoch done at ``step``; ``meta``: the callback's ``total`` steps
    and ``per_epoch`` (absent: any step)."""
    total, per_epoch = meta.get("total"), meta.get("per_epoch")
    if isinstance(total, int) and total and step >= total:
        return False
    return not (isinstance(per_epoch, int) and per_epoch > 1 and pos == per_epoch)
