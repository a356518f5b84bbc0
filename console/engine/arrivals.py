"""A data-parallel rank's own share of a step: its step time less the time it waited for the others.

Every rank of a data-parallel job ends each step in the same AllReduce, so their step times (from
the end of one step to the end of the next) are equal: a rank whose data loader or device is 1.8x
slower makes every rank 1.8x slower, and step times alone cannot name it. What differs is when each
rank arrives with its batch (``Metric.arrive_ts``, the rank's clock as it began the step): the
ranks that arrived earlier waited for the last one, so a rank's work is its step time less
``last arrival - its arrival`` (never below zero nor above the step). The nodes' clocks must agree
to well under a step (NTP does, to a few ms).

``Arrivals`` holds each step's reports until every rank that reports arrivals has made it (or the
step is ``reach`` steps old: a rank gone quiet does not hold the others back), then gives each
rank's work for that step. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Work:
    name: str
    key: int  # the step's key (stragglers.py: epoch * _EPOCH + step)
    seconds: float  # the rank's step time less its wait for the last rank to arrive


class Arrivals:
    def __init__(self, reach: int = 60) -> None:
        self.reach = reach
        self._ranks: set[str] = set()
        # step key -> rank -> (step time, arrival); in the order the steps were first reported
        self._pending: dict[int, dict[str, tuple[float, float]]] = {}
        self._given: int | None = None  # the newest step given

    def reset(self) -> None:
        self._ranks.clear()
        self._pending.clear()
        self._given = None

    def add(self, name: str, key: int, seconds: float, arrive_ts: float) -> list[Work]:
        """Take a rank's report of a step; the work of every step now complete, oldest first."""
        self._ranks.add(name)
        if self._given is not None and key <= self._given:
            return []  # its step was given without it (a rank new to the run): its wait is unknown
        self._pending.setdefault(key, {})[name] = (seconds, arrive_ts)
        out: list[Work] = []
        while self._pending:
            first = next(iter(self._pending))
            got = self._pending[first]
            if len(got) < len(self._ranks) and len(self._pending) <= self.reach:
                break
            del self._pending[first]
            self._given = first if self._given is None else max(self._given, first)
            out.extend(work_of_step(first, got))
        return out


def work_of_step(key: int, reports: dict[str, tuple[float, float]]) -> list[Work]:
    """Each rank's work in one step from its (step time, arrival): see the module's doc."""
    last = max(arrive for _, arrive in reports.values())
    return [
        Work(name, key, seconds - min(max(last - arrive, 0.0), seconds))
        for name, (seconds, arrive) in reports.items()
    ]
