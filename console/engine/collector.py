"""Keep the garbage collector's full passes short while a console runs (the TUI, ``mscon run --no-tui``).

A full pass walks every container object the process holds that is not frozen: at 10,000 nodes of
8 ranks that is half a million per-rank objects (the state's ranks, their deques, the step-time
groups), 200-400 ms with the event loop stalled, every few seconds while they are being made.
They live as long as the attempt, so a full pass that was slow is followed by ``gc.freeze()``:
what survived it is never walked again, and the next pass walks only what came since. A small run
never has a slow pass and is left alone. (The cost: a cycle among objects frozen this way is not
collected once it becomes garbage; only a run big enough to make slow passes freezes.)
"""

from __future__ import annotations

import gc
import time
from typing import Any

# A full pass slower than this: what survived it is frozen. A small run's passes take a few ms; at
# 80,000 ranks, with 50 ms here, passes of 20-49 ms went on unfrozen while the first summary tick
# made the per-rank objects, and a paint's p99 was 62 ms (37-44 ms with 0-10 ms).
SLOW_S = 0.01


class FreezeAfterSlowPasses:
    def __init__(self, slow_s: float = SLOW_S) -> None:
        self.slow_s = slow_s
        self.freezes = 0  # how many slow full passes were followed by a freeze
        self._started = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif phase == "stop" and time.perf_counter() - self._started > self.slow_s:
            gc.freeze()
            self.freezes += 1
