"""Stragglers: ranks whose recent step time is well above the other ranks' (one place, no UI).

Step times are measured where the rank made them, never when their lines reached the console:

- a metric's own ``step_time_s`` (MSCON_METRICS records, MindFormers lines, a TimeMonitor line) is
  taken as it is, less the time the rank waited for the others where its records say when it
  arrived (``arrive_ts``: data parallel, ``arrivals.py``);
- else the time between two metrics' ``ts``: the rank's own clock for an MSCON_METRICS record
  (``mscon_resume`` and the reference trainer write it), else the time the agent read the line. The
  agent stamps every line of one read with that read's time, so lines read together form one group:
  no step time is derived between two lines of a group (that would be the agent's parsing speed,
  microseconds), only across groups, over the steps between them (``_Group``).

``StepTimes`` keeps these samples per rank, each with the step it ends at and the steps it covers;
its ``figures`` give each rank's step time over a window ending at the same step for every rank
(whatever the batching of their metrics): the median of the last ``window`` per-step samples, or,
for samples that each cover a read of the log (quantised to the agent's flush interval), the
steps' total time over their count across at least ``COARSE_READS`` reads, reads that held a pause
left out. ``judge`` compares each rank with the others: where every rank is timed step by step, by
the median of its steps' ratios to the other ranks' same steps (step k of a data-parallel job takes
every rank about as long, however much it wanders from one step to the next), else by its figure
against the median of the others'. The first ``warmup`` step reports of every rank in an attempt
(graph compile, caches, data loader start) give no samples, and a rank needs ``min_samples`` after
them for a verdict.
``find_stragglers`` is a pure function over per-step samples: a rank is a straggler when the median
of its recent step times is at least ``factor`` times the median of the other ranks' medians.
``StragglerWatch`` is the engine's use of both: metrics in, ``StragglerFlagged`` /
``StragglerCleared`` events out, so every view (headless, TUI, summary) reads the same verdicts.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mscon.agent.protocol import Metric, MetricBatch
from mscon.console.engine.arrivals import Arrivals
from mscon.console.engine.events import Event, StragglerCleared, StragglerFlagged
from mscon.console.engine.state import ClusterState

# The defaults, once: the CLI (--straggler-factor, --straggler-window), RunOptions and the policy.
DEFAULT_FACTOR = 1.3  # a straggler's step time is at least this multiple of the others' median
DEFAULT_WINDOW = 20  # steps per rank taken into account
DEFAULT_WARMUP = 3  # each rank's first step reports of an attempt are not judged (compile, caches)
# Nor a rank that costs the others less than this a step, whatever the ratio: ranks sharing cores
# with the console and each other (the local default job's 7 ms steps) lag by a few ms at times.
DEFAULT_MIN_EXCESS_S = 0.01
COARSE_READS = 30  # step times from read times: at least this many reads (3 s at 0.1 s) per figure
# Parsed lines stamped within this long of each other were read together (an agent before read
# stamps, or a replay, stamps them as it parses them: microseconds apart).
_SAME_READ_S = 0.005
_PAUSE = 1.8  # a read whose steps took this multiple of the rank's rate or more held a pause
_EPOCH = 1_000_000_000  # step keys: epoch * _EPOCH + step (steps printed within an epoch)


@dataclass(frozen=True, slots=True)
class StragglerPolicy:
    factor: float = DEFAULT_FACTOR  # a straggler's step time is at least this multiple of the others' median
    window: int = DEFAULT_WINDOW  # steps per rank taken into account
    min_samples: int = 8  # fewer recent step times than this (after the warm-up): no verdict for that rank
    min_ranks: int = 2  # fewer ranks with a verdict than this: nobody is a straggler
    # A flagged rank is cleared only below this multiple (default: halfway between 1 and factor), so
    # a rank hovering at the threshold is not flagged and cleared at every check.
    release: float | None = None
    warmup: int = DEFAULT_WARMUP  # each rank's first N step reports of an attempt give no step times
    min_excess_s: float = DEFAULT_MIN_EXCESS_S  # a straggler is also this much slower a step

    def is_straggler(self, own: float, yardstick: float) -> bool:
        """A rank's step time ``own`` against the others' ``yardstick``: the one test of a straggler."""
        return own >= self.factor * yardstick and own - yardstick >= self.min_excess_s

    @property
    def needed(self) -> int:
        """Step times a rank needs for a verdict: ``min_samples``, or the whole of a shorter window."""
        return max(1, min(self.min_samples, self.window))

    @property
    def clear_below(self) -> float:
        return self.release if self.release is not None else 1.0 + (self.factor - 1.0) / 2


class _Sample:
    """One measured stretch of a rank's steps: ``steps`` steps ending at step ``key`` in ``seconds``."""

    __slots__ = ("key", "seconds", "steps")

    def __init__(self, key: int, steps: int, seconds: float) -> None:
        self.key, self.steps, self.seconds = key, steps, seconds

    @property
    def per_step(self) -> float:
        return self.seconds / self.steps


class _Group:
    """Step times derived from one stream's stamps (a rank's metrics of one source): the metrics
    stamped at the same time (one read of the agent) are one group, measured from the last metric
    of the group before (the anchor) to the group's last metric."""

    __slots__ = ("anchor", "epoch", "last_ts", "sample", "step", "ts")

    def __init__(self, epoch: int, step: int, ts: float) -> None:
        self.epoch, self.step = epoch, step  # the last metric
        self.ts = self.last_ts = ts  # the current group's stamp; the last metric's
        self.anchor: tuple[int, float] | None = None  # (step, ts) the current group is measured from
        self.sample: _Sample | None = None  # the current group's sample, grown in place


class StepTimes:
    """Per-rank step-time samples: the last ``reach`` for verdicts (``figures``), ``keep`` for plots."""

    def __init__(
        self, window: int = DEFAULT_WINDOW, keep: int = 512, warmup: int = 0, reach: int | None = None
    ) -> None:
        self.window = window
        self.keep = keep
        self.warmup = warmup
        # Samples kept per rank: a window ending at the step every rank has reached needs the steps
        # a rank ahead (batched metrics) made since.
        self.reach = reach if reach is not None else 3 * window
        self._samples: dict[str, collections.deque[_Sample]] = {}
        self._history: dict[str, collections.deque[float]] = {}  # longer, for plots
        self._groups: dict[tuple[str, str], _Group] = {}  # (rank, source) -> its stamps so far
        self._top: dict[str, tuple[int, int]] = {}  # rank -> (epoch, step) of its latest step report
        self._seen: dict[str, int] = {}  # rank -> step reports this attempt (the warm-up)
        # Ranks that report step_time_s: their derived times are left out, being only as fine as
        # the agent's flush interval (a rank flushed every 0.1 s seems to take 0.1 s a step).
        self._reported: set[str] = set()
        self._coarse: set[str] = set()  # ranks timed by the agent's reads (parsed lines)
        # Each rank's figure, recomputed only after a new sample or a new common step: at 8,000
        # ranks, figures of every rank at every check cost more than the rest of the view.
        self._cache: dict[str, tuple[int, tuple[bool, float] | None]] = {}
        # Step by step: every rank's own step time of each recent step (sorted), and each rank's
        # ratios of its steps to the other ranks' same steps, taken once every ready rank has made
        # the step (``judge``).
        self._by_step: dict[int, list[float]] = {}
        self._steps_seen: collections.deque[int] = collections.deque()  # _by_step's keys, oldest first
        self._ratios: dict[str, collections.deque[float]] = {}
        self._rated: dict[str, int] = {}  # rank -> the last step it has a ratio of (or passed)
        self._ratio_cache: dict[str, tuple[int, float]] = {}  # rank -> (ratios taken, their median)
        self._upto = 0  # the step of the last windows (``_windows``)
        # The samples' keys and seconds again, for the windows of ranks timed step by step (all
        # but those in _coarse or _multi, the ranks with samples of several steps): the common case
        # without a Python loop over every rank's window at every check.
        self._keys: dict[str, collections.deque[int]] = {}
        self._secs: dict[str, collections.deque[float]] = {}
        self._multi: set[str] = set()
        self._arrivals = Arrivals(self.reach)  # step times that arrive_ts turns into work (arrivals.py)

    def reset(self) -> None:
        """A new attempt: every rank starts again."""
        self._arrivals.reset()
        for d in (self._samples, self._history, self._groups, self._top, self._seen, self._cache):
            d.clear()
        for d in (self._by_step, self._ratios, self._rated, self._ratio_cache, self._keys, self._secs):
            d.clear()
        self._multi.clear()
        self._steps_seen.clear()
        self._reported.clear()
        self._coarse.clear()

    def observe(self, msg: Metric) -> bool:
        """Take one metric; True when it gave the rank a new step time (or grew its last one)."""
        name = msg.name
        epoch = msg.epoch if msg.epoch is not None else 0
        g = self._groups.get((name, msg.source))
        if g is not None and (epoch, msg.step) <= (g.epoch, g.step):
            return False  # a repeat (the same step from another path) or out of order: no new step
        warm = self._warming(name, epoch, msg.step)
        value = msg.step_time_s
        if value is not None:
            self._timed(name, msg.source, epoch, msg)
            if name not in self._reported:
                self._reported.add(name)
                if name in self._samples:  # exact figures from now on: the derived ones go
                    self._samples[name].clear()
                    self._keys[name].clear()
                    self._secs[name].clear()
                    self._coarse.discard(name)
                    self._multi.discard(name)
            if warm or value <= 0:
                return False
            key = epoch * _EPOCH + msg.step
            if msg.arrive_ts is not None:  # data parallel: each rank's own share of the step
                fresh = False
                for w in self._arrivals.add(name, key, value, msg.arrive_ts):
                    if w.seconds > 0:
                        self._step_time(w.key, w.seconds)
                        fresh = self._add(w.name, _Sample(w.key, 1, w.seconds)) or fresh
                return fresh
            self._step_time(key, value)
            return self._add(name, _Sample(key, 1, value))
        if name in self._reported:
            self._timed(name, msg.source, epoch, msg)
            return False
        return self._derive(name, msg.source, epoch, msg, warm)

    def _warming(self, name: str, epoch: int, step: int) -> bool:
        """Count the rank's step report; True while it is one of the first ``warmup``."""
        top = self._top.get(name)
        if top is None or (epoch, step) > top:
            self._top[name] = (epoch, step)
            self._seen[name] = self._seen.get(name, 0) + 1
        return self._seen.get(name, 0) <= self.warmup

    def _timed(self, name: str, source: str, epoch: int, msg: Metric) -> None:
        """The stream's latest metric, when it needs no derived time."""
        g = self._groups.get((name, source))
        if g is None:
            self._groups[(name, source)] = _Group(epoch, msg.step, msg.ts)
        else:
            g.epoch, g.step, g.anchor, g.sample = epoch, msg.step, None, None
            g.ts = g.last_ts = msg.ts

    def _derive(self, name: str, source: str, epoch: int, msg: Metric, warm: bool) -> bool:
        """A step time from the stream's stamps (see ``_Group``)."""
        key = (name, source)
        g = self._groups.get(key)
        ts = msg.ts
        if g is None:
            self._groups[key] = _Group(epoch, msg.step, ts)
            return False
        if not ts or not g.ts or g.epoch != epoch or ts < g.last_ts:
            # No stamp, a new epoch (steps printed within an epoch: their count across is unknown)
            # or a clock gone back: measure again from here.
            g.epoch, g.step, g.anchor, g.sample = epoch, msg.step, None, None
            g.ts = g.last_ts = ts
            return False
        same_read = ts == g.last_ts or (source == "parsed" and ts - g.last_ts < _SAME_READ_S)
        if not same_read:  # a new group, measured from the last metric of the one before
            g.anchor, g.sample, g.ts = (g.step, g.ts), None, ts
        g.epoch, g.step, g.last_ts = epoch, msg.step, ts
        if g.anchor is None or warm:
            return False
        steps, seconds = msg.step - g.anchor[0], g.ts - g.anchor[1]
        if steps <= 0 or seconds <= 0:
            return False
        if source == "parsed":
            self._coarse.add(name)
        q = self._samples.get(name)
        if g.sample is not None and q and q[-1] is g.sample:  # the same read: its sample grows
            g.sample.key, g.sample.steps, g.sample.seconds = epoch * _EPOCH + msg.step, steps, seconds
            self._multi.add(name)
            if self.keep and self._history.get(name):
                self._history[name][-1] = g.sample.per_step
            self._changed(name)
            return True
        g.sample = _Sample(epoch * _EPOCH + msg.step, steps, seconds)
        if steps == 1 and source != "parsed":  # the rank's clock, step by step
            self._step_time(g.sample.key, seconds)
        return self._add(name, g.sample)

    def _step_time(self, key: int, seconds: float) -> None:
        values = self._by_step.get(key)
        if values is None:
            values = self._by_step[key] = []
            self._steps_seen.append(key)
            if len(self._steps_seen) > 2 * self.reach:
                self._by_step.pop(self._steps_seen.popleft(), None)
        bisect.insort(values, seconds)

    def _add(self, name: str, sample: _Sample) -> bool:
        q = self._samples.get(name)
        if q is None:
            q = self._samples[name] = collections.deque(maxlen=self.reach)
            self._keys[name] = collections.deque(maxlen=self.reach)
            self._secs[name] = collections.deque(maxlen=self.reach)
            if self.keep:
                self._history[name] = collections.deque(maxlen=self.keep)
        q.append(sample)
        self._keys[name].append(sample.key)
        self._secs[name].append(sample.seconds)
        if sample.steps > 1:
            self._multi.add(name)
        if self.keep:
            self._history[name].append(sample.per_step)
        self._changed(name)
        return True

    def _changed(self, name: str) -> None:
        self._cache.pop(name, None)

    def __len__(self) -> int:
        """Ranks with step times."""
        return len(self._samples)

    def recent(self, name: str) -> Sequence[float]:
        """The rank's last ``window`` step times (seconds per step of each sample)."""
        q = self._samples.get(name, ())
        return tuple(s.per_step for s in list(q)[-self.window :])

    def history(self, name: str) -> Sequence[float]:
        return tuple(self._history.get(name, ()))

    def latest(self, name: str) -> float | None:
        q = self._samples.get(name)
        return q[-1].per_step if q else None

    def samples(self, names: Iterable[str] | None = None) -> dict[str, Sequence[float]]:
        keys = self._samples.keys() if names is None else names
        return {n: self.recent(n) for n in keys if self._samples.get(n)}

    def figures(self, names: Iterable[str], min_samples: int) -> dict[str, float]:
        """Each named rank's step time over a window ending at the latest step every one of them
        with ``min_samples`` samples has reached (the same steps for all: see the module's doc); a
        rank whose kept samples do not reach that far back is taken over its own latest steps."""
        return {name: figure for name, (_, figure) in self._windows(names, min_samples).items()}

    def judge(
        self, names: Iterable[str], min_samples: int, min_ranks: int = 2
    ) -> dict[str, tuple[float, float]]:
        """Each named rank's step time and its yardstick, the other ranks' (none below
        ``min_ranks`` ranks): their median step time, or, where every rank's samples are its own
        step by step, the rank's step time over the median of its steps' ratios to the other ranks'
        same steps. Step k of a data-parallel job takes every rank about as long, however much it
        wanders from one step to the next (a median of 20 such steps does not), and a rank's rare
        long step is one ratio of 20, however long."""
        windows = self._windows(names, min_samples)
        if len(windows) < min_ranks:
            return {}
        figures = {name: figure for name, (_, figure) in windows.items()}
        out = {name: (figures[name], others) for name, others in _others(figures).items()}
        if any(coarse for coarse, _ in windows.values()):
            return out  # stretches of reads end at other steps on every rank: no step to compare
        upto = self._upto
        for name, (_, figure) in windows.items():
            ratio = self._ratio(name, upto, min_samples)
            if ratio is not None:
                out[name] = (figure, figure / ratio)
        return out

    def _ratio(self, name: str, upto: int, min_samples: int) -> float | None:
        """The median of the rank's last ``window`` ratios of a step of its own to the other ranks'
        same step, taking those of its steps up to ``upto`` not taken yet; None below
        ``min_samples`` (a rank too far ahead or behind the others has none: its steps are gone)."""
        rated = self._rated.get(name, -1)
        if upto > rated:
            fresh = []
            for s in reversed(self._samples[name]):
                if s.key <= rated:
                    break
                if s.key <= upto:
                    fresh.append(s)
            ratios = self._ratios.get(name)
            if ratios is None:
                ratios = self._ratios[name] = collections.deque(maxlen=self.window)
            for s in reversed(fresh):
                values = self._by_step.get(s.key)
                if values is not None and len(values) > 1:
                    others = _median_without(values, bisect.bisect_left(values, s.seconds))
                    if others > 0:
                        ratios.append(s.seconds / others)
            self._rated[name] = upto
            self._ratio_cache.pop(name, None)
        ratios = self._ratios.get(name)
        if not ratios or len(ratios) < min_samples:
            return None
        cached = self._ratio_cache.get(name)
        if cached is None:
            cached = self._ratio_cache[name] = (len(ratios), statistics.median(ratios))
        return cached[1]

    def _windows(self, names: Iterable[str], min_samples: int) -> dict[str, tuple[bool, float]]:
        """(coarse, figure) of each rank with one (``figures``)."""
        ready = [n for n in names if len(self._samples.get(n, ())) >= min_samples]
        if not ready:
            return {}
        upto = self._upto = min(self._samples[n][-1].key for n in ready)
        out = {}
        for name in ready:
            cached = self._cache.get(name)
            if cached is not None and cached[0] == upto:
                window = cached[1]
            else:
                window = self._window(name, upto, min_samples)
                if window is None:  # its kept samples end past the common step: its own latest
                    window = self._window(name, None, min_samples)
                self._cache[name] = (upto, window)
            if window is not None:
                out[name] = window
        return out

    def _window(self, name: str, upto: int | None, min_samples: int) -> tuple[bool, float] | None:
        """(coarse, figure) of the rank's window ending at ``upto`` (None: its latest)."""
        if name not in self._coarse and name not in self._multi:  # step by step: the window's median
            keys = self._keys[name]
            end = len(keys)
            if upto is not None:
                while end and keys[end - 1] > upto:
                    end -= 1
            if end < min_samples:
                return None
            return False, statistics.median(
                itertools.islice(self._secs[name], max(0, end - self.window), end)
            )
        q = self._samples[name]
        taken: list[_Sample] = []
        steps = 0
        for s in reversed(q):
            if upto is not None and s.key > upto:
                continue
            taken.append(s)
            steps += s.steps
            if steps >= self.window and len(taken) >= COARSE_READS:
                break
        if len(taken) < max(min_samples, COARSE_READS):
            return None
        # Reads quantise each sample: the total over the stretch is the figure, but for the reads
        # that held a pause (a collection, a checkpoint: their steps took _PAUSE x the rate or
        # more), left out as a median leaves out a rare long step.
        rate = sum(s.seconds for s in taken) / steps
        kept = [s for s in taken if s.seconds < _PAUSE * rate * s.steps]
        return True, sum(s.seconds for s in kept) / sum(s.steps for s in kept) if kept else rate


def find_stragglers(
    samples: Mapping[str, Sequence[float]], policy: StragglerPolicy = StragglerPolicy()
) -> frozenset[str]:
    """Ranks whose median step time (last ``policy.window`` steps) is >= ``policy.factor`` x the
    median of the other ranks' medians."""
    medians = {
        name: statistics.median(values if len(values) <= policy.window else list(values)[-policy.window :])
        for name, values in samples.items()
        if len(values) >= policy.needed
    }
    return stragglers_by_median(medians, policy)


def stragglers_of(
    times: StepTimes, names: Iterable[str], policy: StragglerPolicy = StragglerPolicy()
) -> frozenset[str]:
    """The verdicts over ``times``' figures of ``names`` (aligned windows, cached; the window is
    ``times.window``, which the view sets to ``policy.window``)."""
    judged = times.judge(names, policy.needed, policy.min_ranks)
    return frozenset(name for name, (own, others) in judged.items() if policy.is_straggler(own, others))


def stragglers_by_median(
    medians: Mapping[str, float], policy: StragglerPolicy = StragglerPolicy()
) -> frozenset[str]:
    """The comparison itself, over each rank's median step time."""
    others = others_medians(medians, policy)
    return frozenset(name for name, value in others.items() if policy.is_straggler(medians[name], value))


def others_medians(
    medians: Mapping[str, float], policy: StragglerPolicy = StragglerPolicy()
) -> dict[str, float]:
    """Each rank's yardstick: the median of the other ranks' medians (none below ``min_ranks``)."""
    if len(medians) < policy.min_ranks:
        return {}
    return _others(medians)


def _others(values: Mapping[str, float]) -> dict[str, float]:
    """Each name's median of the other names' values (two names or more)."""
    ordered = sorted(values.values())
    index: dict[float, int] = {}
    for i, v in enumerate(ordered):
        index.setdefault(v, i)
    return {name: _median_without(ordered, index[value]) for name, value in values.items()}


def _median_without(ordered: Sequence[float], skip: int) -> float:
    """The median of the sorted values without the one at ``skip`` (O(1))."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < skip else k + 1]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2


def straggler_verdict(policy: StragglerPolicy, flagged: bool, own: float, yardstick: float) -> bool | None:
    """The one straggler rule, for the engine, an attach and a replay alike (each through
    ``StragglerWatch``): True flags a rank (``policy.is_straggler``), False clears a flagged one
    (below ``policy.clear_below`` x the yardstick: a rank hovering at the threshold is not flagged
    and cleared at every check), None changes nothing."""
    if flagged:
        return False if own < policy.clear_below * yardstick else None
    return True if policy.is_straggler(own, yardstick) else None


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
        self.times = StepTimes(policy.window, keep=0, warmup=policy.warmup)
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
        events: list[Event] = []
        judged = self.times.judge(live, policy.needed, policy.min_ranks)
        for name, (own, yardstick) in judged.items():  # empty when too few ranks to compare: no change
            node, step = self._where.get(name, ("", 0))
            verdict = straggler_verdict(policy, name in self._flagged, own, yardstick)
            if verdict is False:
                self._flagged.discard(name)
                events.append(StragglerCleared(self._attempt, name, node, step, own, yardstick))
            elif verdict is True:
                self._flagged.add(name)
                events.append(
                    StragglerFlagged(self._attempt, name, node, step, own, yardstick, policy.factor)
                )
        return events
