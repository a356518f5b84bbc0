"""Stragglers: ranks whose recent step time is well above the other ranks' (one place, no UI).

``StepTimes`` is a small reducer fed with the agents' ``Metric`` messages: per rank, the step times
of the last ``window`` steps, taken from ``step_time_s`` where the rank reports it and otherwise
derived from consecutive metrics (time between them over the steps between them).
``find_stragglers`` is a pure function over those samples: a rank is a straggler when the median
of its recent step times is at least ``factor`` times the median of the other ranks' medians.
``StragglerWatch`` is the engine's use of both: metrics in, ``StragglerFlagged`` /
``StragglerCleared`` events out, so every view (headless, TUI, summary) reads the same verdicts.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mscon.agent.protocol import Metric, MetricBatch
from mscon.console.engine.events import Event, StragglerCleared, StragglerFlagged
from mscon.console.engine.state import ClusterState


@dataclass(frozen=True, slots=True)
class StragglerPolicy:
    factor: float = 1.3  # a straggler's step time is at least this multiple of the others' median
    window: int = 20  # steps per rank taken into account
    min_samples: int = 3  # fewer recent step times than this: no verdict for that rank
    min_ranks: int = 2  # fewer ranks with a verdict than this: nobody is a straggler
    # A flagged rank is cleared only below this multiple (default: halfway between 1 and factor), so
    # a rank hovering at the threshold is not flagged and cleared at every check.
    release: float | None = None

    @property
    def clear_below(self) -> float:
        return self.release if self.release is not None else 1.0 + (self.factor - 1.0) / 2


class StepTimes:
    """Per-rank step-time history over the last ``window`` steps."""

    def __init__(self, window: int = 20, keep: int = 512) -> None:
        self.window = window
        self.keep = keep
        self._samples: dict[str, collections.deque[float]] = {}
        self._history: dict[str, collections.deque[float]] = {}  # longer, for plots
        # (rank, source) -> (epoch, step, ts) of the last metric: step times derived from timestamps
        self._last: dict[tuple[str, str], tuple[int, int, float]] = {}
        # Each rank's median of its recent step times, recomputed only after a new sample: at
        # 8,000 ranks, medians of every rank at every check cost more than the rest of the view.
        self._medians: dict[str, float] = {}
        self._dirty: set[str] = set()
        # Ranks that report step_time_s: their derived times are left out, being only as fine as
        # the agent's flush interval (a rank flushed every 0.1 s seems to take 0.1 s a step).
        self._reported: set[str] = set()

    def reset(self) -> None:
        """A new attempt: every rank starts again."""
        self._samples.clear()
        self._history.clear()
        self._last.clear()
        self._medians.clear()
        self._dirty.clear()
        self._reported.clear()

    def observe(self, msg: Metric) -> bool:
        """Take one metric; True when it gave the rank a new step time."""
        epoch = msg.epoch if msg.epoch is not None else 0
        key = (msg.name, msg.source)
        prev = self._last.get(key)
        if prev is not None and (epoch, msg.step) <= prev[:2]:
            return False  # a repeat (the same step from another path) or out of order: no new step
        self._last[key] = (epoch, msg.step, msg.ts)
        value = msg.step_time_s
        if value is not None:
            if msg.name not in self._reported:
                self._reported.add(msg.name)
                if msg.name in self._samples:  # exact figures from now on: the derived ones go
                    self._samples[msg.name].clear()
        elif msg.name in self._reported:
            return False
        elif prev is not None and prev[0] == epoch and msg.ts and prev[2]:
            steps = msg.step - prev[1]
            value = (msg.ts - prev[2]) / steps if steps > 0 and msg.ts > prev[2] else None
        if value is None or value <= 0:
            return False
        q = self._samples.get(msg.name)
        if q is None:
            q = self._samples[msg.name] = collections.deque(maxlen=self.window)
            self._history[msg.name] = collections.deque(maxlen=self.keep)
        q.append(value)
        self._history[msg.name].append(value)
        self._dirty.add(msg.name)
        return True

    def __len__(self) -> int:
        """Ranks with step times."""
        return len(self._samples)

    def recent(self, name: str) -> Sequence[float]:
        return tuple(self._samples.get(name, ()))

    def history(self, name: str) -> Sequence[float]:
        return tuple(self._history.get(name, ()))

    def latest(self, name: str) -> float | None:
        q = self._samples.get(name)
        return q[-1] if q else None

    def samples(self, names: Iterable[str] | None = None) -> dict[str, Sequence[float]]:
        keys = self._samples.keys() if names is None else names
        return {n: self._samples[n] for n in keys if n in self._samples}

    def medians(self, names: Iterable[str], min_samples: int) -> dict[str, float]:
        """Median of each named rank's last ``window`` step times, for ranks with ``min_samples`` or more."""
        for name in self._dirty:
            q = self._samples.get(name)
            if q:
                self._medians[name] = statistics.median(q)
        self._dirty.clear()
        samples, medians = self._samples, self._medians
        return {n: medians[n] for n in names if n in medians and len(samples[n]) >= min_samples}


def find_stragglers(
    samples: Mapping[str, Sequence[float]], policy: StragglerPolicy = StragglerPolicy()
) -> frozenset[str]:
    """Ranks whose median step time (last ``policy.window`` steps) is >= ``policy.factor`` x the
    median of the other ranks' medians."""
    medians = {
        name: statistics.median(values if len(values) <= policy.window else list(values)[-policy.window :])
        for name, values in samples.items()
        if len(values) >= policy.min_samples
    }
    return stragglers_by_median(medians, policy)


def stragglers_of(
    times: StepTimes, names: Iterable[str], policy: StragglerPolicy = StragglerPolicy()
) -> frozenset[str]:
    """``find_stragglers`` over ``times``' samples of ``names``, from its cached medians (the
    samples' window is ``times.window``, which the view sets to ``policy.window``)."""
    return stragglers_by_median(times.medians(names, policy.min_samples), policy)


def stragglers_by_median(
    medians: Mapping[str, float], policy: StragglerPolicy = StragglerPolicy()
) -> frozenset[str]:
    """The comparison itself, over each rank's median step time."""
    others = others_medians(medians, policy)
    return frozenset(name for name, value in others.items() if medians[name] >= policy.factor * value)


def others_medians(
    medians: Mapping[str, float], policy: StragglerPolicy = StragglerPolicy()
) -> dict[str, float]:
    """Each rank's yardstick: the median of the other ranks' medians (none below ``min_ranks``)."""
    if len(medians) < policy.min_ranks:
        return {}
    ordered = sorted(medians.values())
    index: dict[float, int] = {}
    for i, v in enumerate(ordered):
        index.setdefault(v, i)
    return {name: _median_without(ordered, index[value]) for name, value in medians.items()}


def _median_without(ordered: Sequence[float], skip: int) -> float:
    """The median of the sorted values without the one at ``skip`` (O(1))."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < skip else k + 1]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2


class StragglerWatch:
    """The engine's straggler verdicts: each rank's metrics in, flag and clear events out.

    The comparison runs once per round of new step times (as many as ranks reporting them), not at
    every metric: a sort over 8,000 ranks per metric would cost more than the rest of the engine, and
    a count, unlike a clock, gives a replayed recording the same verdicts as the live run. Only live
    workers are compared; a flagged rank that exits leaves the comparison without a clear event
    (ClusterState counts only live ranks as current stragglers).
    """

    def __init__(self, policy: StragglerPolicy, state: ClusterState) -> None:
        self.policy = policy
        self.state = state
        self.times = StepTimes(policy.window, keep=0)
        self._attempt = -1
        self._fresh = 0  # new step times since the last comparison
        self._flagged: set[str] = set()
        self._where: dict[str, tuple[str, int]] = {}  # rank -> (node, last step)

    def observe(self, attempt: int, msg: Metric | MetricBatch) -> list[Event]:
        """Take a metric (or a batch of one rank's); the events it brings, usually none."""
        if attempt != self._attempt:  # a new attempt: every rank starts again
            self._attempt, self._fresh = attempt, 0
            self.times.reset()
            self._flagged.clear()
            self._where.clear()
        for m in msg.metrics if isinstance(msg, MetricBatch) else (msg,):
            self._where[m.name] = (m.node, m.step)
            if self.times.observe(m):
                self._fresh += 1
        if self._fresh < max(1, len(self.times)):
            return []
        self._fresh = 0
        return self._compare()

    def _compare(self) -> list[Event]:
        policy = self.policy
        live = {r.name for r in self.state.workers() if r.state.live}
        self._flagged &= live
        medians = self.times.medians(live, policy.min_samples)
        others = others_medians(medians, policy)
        events: list[Event] = []
        for name, yardstick in others.items():  # empty when too few ranks to compare: no change
            own = medians[name]
            node, step = self._where.get(name, ("", 0))
            if name in self._flagged:
                if own < policy.clear_below * yardstick:
                    self._flagged.discard(name)
                    events.append(StragglerCleared(self._attempt, name, node, step, own, yardstick))
            elif own >= policy.factor * yardstick:
                self._flagged.add(name)
                events.append(
                    StragglerFlagged(self._attempt, name, node, step, own, yardstick, policy.factor)
                )
        return events
