"""The arithmetic of bench/chaos.py: which steps count, what each fault cost. Pure: no I/O, no clock.

A run is a series of attempts; each rank reports the global step it completed and when (wall
clock, the same on every rank here). Attempt N resumes at ``resumed_at`` (its first step minus
one) and reaches ``last``. A step of attempt N *counts* when no later attempt redoes it: it is at
most the resume point of every later attempt (a later attempt that resumed below it threw it away,
whether or not it got that far again).

A step's time is the gap since the attempt's previous step completed on every rank (so snapshot
and checkpoint costs are in it); an attempt's first step gets the median gap of that attempt,
since the time before it is start-up or recovery, not training.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class StepMark:
    """A rank completed a step."""

    attempt: int
    rank: int
    step: int  # global optimizer step, 1-based
    ts: float  # wall-clock seconds


@dataclass(frozen=True)
class Fault:
    """A rank was killed."""

    ts: float
    rank: int
    attempt: int  # the attempt it hit


@dataclass(frozen=True)
class Attempt:
    number: int
    done: dict[int, float]  # step -> when the last rank reporting it completed it
    first_step_all: float | None  # every rank at its first step of this attempt; None: some never got there

    @property
    def resumed_at(self) -> int:
        return min(self.done) - 1

    @property
    def last(self) -> int:
        return max(self.done)


@dataclass(frozen=True)
class FaultCost:
    fault: Fault
    last_step: int | None  # the last step the attempt it hit reached
    resumed_at: int | None  # where the next attempt resumed; None: it never stepped
    recovery_s: float | None  # fault -> every rank of the next attempt at its first step

    @property
    def steps_lost(self) -> int | None:
        if self.last_step is None or self.resumed_at is None:
            return None
        return max(0, self.last_step - self.resumed_at)


def attempts(marks: Iterable[StepMark], world: int) -> dict[int, Attempt]:
    """Each attempt that reported a step, by number."""
    done: dict[int, dict[int, float]] = {}
    first: dict[int, dict[int, float]] = {}
    for m in marks:
        steps = done.setdefault(m.attempt, {})
        steps[m.step] = max(steps.get(m.step, m.ts), m.ts)
        ranks = first.setdefault(m.attempt, {})
        ranks[m.rank] = min(ranks.get(m.rank, m.ts), m.ts)
    out = {}
    for n in sorted(done):
        ranks = first[n]
        all_at = max(ranks.values()) if len(ranks) >= world else None
        out[n] = Attempt(n, dict(sorted(done[n].items())), all_at)
    return out


def counted_steps(runs: dict[int, Attempt]) -> dict[int, list[int]]:
    """Attempt number -> its steps that no later attempt redid."""
    out: dict[int, list[int]] = {}
    keep_upto = math.inf  # the lowest resume point of the attempts after this one
    for n in sorted(runs, reverse=True):
        att = runs[n]
        out[n] = [s for s in att.done if s <= keep_upto]
        keep_upto = min(keep_upto, att.resumed_at)
    return dict(sorted(out.items()))


def step_seconds(att: Attempt) -> dict[int, float]:
    """Each step's time in the attempt (see the module's docstring)."""
    steps = list(att.done)
    gaps = {b: att.done[b] - att.done[a] for a, b in itertools.pairwise(steps)}
    first = statistics.median(gaps.values()) if gaps else 0.0
    return {steps[0]: first, **gaps}


def training_seconds(runs: dict[int, Attempt]) -> float:
    """Time spent on steps that count."""
    total = 0.0
    for n, steps in counted_steps(runs).items():
        took = step_seconds(runs[n])
        total += sum(took[s] for s in steps)
    return total


def effective_ratio(runs: dict[int, Attempt], wall_s: float) -> float:
    return training_seconds(runs) / wall_s if wall_s > 0 else 0.0


def fault_costs(runs: dict[int, Attempt], faults: Iterable[Fault]) -> list[FaultCost]:
    """What each fault cost: the next attempt (number + 1) is the restart it caused."""
    out = []
    for f in faults:
        hit, nxt = runs.get(f.attempt), runs.get(f.attempt + 1)
        recovery = None
        if nxt is not None and nxt.first_step_all is not None:
            recovery = nxt.first_step_all - f.ts
        out.append(
            FaultCost(
                f,
                None if hit is None else hit.last,
                None if nxt is None else nxt.resumed_at,
                recovery,
            )
        )
    return out


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolated between the closest ranks; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
