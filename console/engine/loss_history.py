"""A rank's recent (step, loss) points for the plots, kept as two flat arrays.

A deque of (step, loss) tuples costs about 110 bytes a point (the tuple, an int, a float): 512
points for each of 80,000 ranks were 4.5 GB once a run had made 512 steps. Here a point is 16
bytes, nothing is allocated before the first point, and the ring is no longer than ``limit``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator


class LossHistory:
    """The last ``limit`` (step, loss) points, oldest first; iterates as (step, loss) tuples."""

    __slots__ = ("_steps", "_losses", "_head", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._steps: array[int] | None = None
        self._losses: array[float] | None = None
        self._head = 0  # once full: where the oldest point is (and the next one goes)

    def append(self, point: tuple[int, float]) -> None:
        step, loss = point
        if self._steps is None or self._losses is None:
            self._steps, self._losses = array("q"), array("d")
        if len(self._steps) < self.limit:
            self._steps.append(step)
            self._losses.append(loss)
            return
        self._steps[self._head], self._losses[self._head] = step, loss
        self._head = (self._head + 1) % self.limit

    def __len__(self) -> int:
        return 0 if self._steps is None else len(self._steps)

    def __iter__(self) -> Iterator[tuple[int, float]]:
        if self._steps is None or self._losses is None:
            return iter(())
        h = self._head
        steps = self._steps[h:] + self._steps[:h]
        losses = self._losses[h:] + self._losses[:h]
        return zip(steps, losses, strict=True)


def limit_for(workers: int, budget: int, most: int) -> int:
    """Points kept per rank: ``most``, or fewer where ``workers`` x ``most`` would pass ``budget``
    points in all (never under 64: a plot still shows a trend)."""
    if workers <= 0:
        return most
    return max(min(most, 64), min(most, budget // workers))
