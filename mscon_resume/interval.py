"""Every how many steps a snapshot is taken: fixed, or chosen by a budget of the step time."""

from __future__ import annotations

import math

from .collective import agree_max

AUTO = "auto"


class Interval:
    """Fixed, or (``auto``) every step until ``PROBE_STEPS`` have been timed, then the fewest steps
    whose copies cost at most ``budget`` of the step time. Every rank must snapshot the same steps
    (the resume needs one all have), so the ranks agree on the largest of their figures: one
    AllReduce, at one step, on every rank."""

    PROBE_STEPS = 5

    def __init__(self, every: int | str, budget: float) -> None:
        self.auto = every == AUTO
        self.every = 1 if self.auto else int(every)
        self.budget = budget
        self._timed: list[float] = []
        self.step_s = 0.0  # the step time the auto interval was chosen by (0 until then)

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def observe(self, step_s: float, cost_s: float, rank: int, size: int) -> int | None:
        """After each step (``cost_s``: what a snapshot costs the step, so far): the agreed
        interval once decided at this step, else None."""
        if not self.auto or len(self._timed) > self.PROBE_STEPS:
            return None
        self._timed.append(step_s)
        if len(self._timed) <= self.PROBE_STEPS:
            return None
        # The first step compiles; the others ran beside a snapshot's write (one every step while
        # probing): the quickest is the closest to the step's own time.
        self.step_s = min(self._timed[1:])
        self.every = agree_max(budget_interval(cost_s, self.step_s, self.budget), rank, size)
        return self.every


FREE_COST_S = 0.003  # a snapshot this cheap is taken every step, whatever the budget says


def budget_interval(cost_s: float, step_s: float, budget: float) -> int:
    """The fewest steps between snapshots whose cost (``cost_s`` each: the copy, and on CPU the
    background write, which takes cores from the step) is at most ``budget`` of the step time: a
    restart then loses at most that many steps. A snapshot under ``FREE_COST_S`` (a small model's:
    up to about half a megabyte) is taken every step: a restart then loses at most one step, for
    a cost no real step notices, though a tiny step's share may pass the budget."""
    if cost_s <= FREE_COST_S or step_s <= 0:
        return 1
    return max(1, math.ceil(cost_s / (budget * step_s)))
