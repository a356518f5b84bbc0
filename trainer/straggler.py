"""``--slow-rank R --slow X``: rank R as a straggler whose every step takes X times its own time.

The extra time is spent before the rank arrives in the step, as a slow data loader would spend it:
its peers then wait for it in the step's AllReduce, which is what a real straggler costs a
data-parallel job. Its own time is its step's time less the sleep (the median of its last few
steps: a step's time wanders), the first step left out (the graph's compile).
"""

from __future__ import annotations

import collections
import statistics
import time


class SlowLoader:
    def __init__(self, factor: float) -> None:
        self.factor = factor
        self._own: collections.deque[float] = collections.deque(maxlen=5)
        self._steps = 0
        self._slept = 0.0

    def load(self) -> None:
        """Before the rank arrives in the step: sleep (factor - 1) times its own step time."""
        self._slept = (self.factor - 1.0) * statistics.median(self._own) if self._own else 0.0
        if self._slept > 0:
            time.sleep(self._slept)

    def took(self, step_s: float) -> None:
        """The step took ``step_s`` in all (the sleep included)."""
        self._steps += 1
        if self.factor > 1.0 and self._steps > 1:
            self._own.append(max(step_s - self._slept, 0.0))
