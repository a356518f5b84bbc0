"""The view's intake: the bus handler only appends; a timer drains the buffer a few times a second.

``Feed.handle`` is the sink handler (an append, nothing else: the engine never waits on the view).
``Feed.drain`` runs on the view's timer: it files log lines in the LineStore, keeps the step-time
history and the cluster series, and returns what changed, so that widgets update only what they
show. The ClusterState itself is the source's (already current); the stragglers are its too (the
engine's StragglerFlagged / StragglerCleared events), never computed here.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mscon.agent.protocol import (
    AgentError,
    Evidence,
    LogBatch,
    Metric,
    MetricBatch,
    NodeSummary,
    ProcExited,
    ProcHung,
    ProcStarted,
    Telemetry,
    TelemetryBatch,
)
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptStarted,
    AwaitingOperator,
    CheckReported,
    ChecksFinished,
    Event,
    NodeState,
    NodeUpdate,
    Notice,
    ReplicaDivergence,
    Restarting,
    RunFinished,
    RunStarted,
    StandbyUpdated,
    Stopping,
    StragglerCleared,
    StragglerFlagged,
)
from mscon.console.engine.stragglers import StepTimes
from mscon.console.views.tui.linestore import LineStore
from mscon.console.views.tui.series import ClusterSeries
from mscon.console.views.tui.source import Source


@dataclass(slots=True)
class Changes:
    """What one drain brought."""

    events: int = 0
    ranks: set[str] = field(default_factory=set)  # ranks whose numbers, state or last line changed
    lines: set[str] = field(default_factory=set)  # ranks with new log lines
    structure: bool = False  # the set of ranks or nodes changed (a run or an attempt started)
    nodes: bool = False
    checks: bool = False
    failure: bool = False  # failures, stops, attempt ends: the root cause may have changed
    metrics: bool = False
    stragglers: bool = False
    notices: list[str] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # perf_counter() at each event's arrival

    def __bool__(self) -> bool:
        return self.events > 0 or self.stragglers


class Feed:
    def __init__(self, source: Source, store: LineStore) -> None:
        self.source = source
        self.store = store
        self.step_times = StepTimes()  # for the step-time columns and plots; not for verdicts
        self.series = ClusterSeries()
        self.stragglers: frozenset[str] = frozenset()
        self.notices: collections.deque[str] = collections.deque(maxlen=200)
        self._pending: collections.deque[tuple[float, Event]] = collections.deque()
        self.total_events = 0
        self.wake: Callable[[], None] | None = None  # told once when the buffer stops being empty
        self._woken = False

    def handle(self, event: Event) -> None:
        """The bus sink: buffer and return (the first event after a drain also wakes the view)."""
        self._pending.append((time.perf_counter(), event))
        if not self._woken and self.wake is not None:
            self._woken = True
            self.wake()

    @property
    def backlog(self) -> int:
        return len(self._pending)

    def _observe(self, m: Metric) -> None:
        timed = self.step_times.observe(m)
        self.series.observe(m, self.step_times.latest(m.name) if timed else None)

    def drain(self, limit: int = 200_000) -> Changes:
        ch = Changes()
        self._woken = False
        pending = self._pending
        metrics_seen = False
        n = 0
        while pending and n < limit:
            arrival, ev = pending.popleft()
            n += 1
            ch.arrivals.append(arrival)
            if isinstance(ev, AgentEvent):
                msg = ev.msg
                if isinstance(msg, LogBatch):
                    self.store.append(msg.name, msg.lines)
                    ch.lines.add(msg.name)
                    ch.ranks.add(msg.name)
                elif isinstance(msg, MetricBatch):
                    for m in msg.metrics:
                        self._observe(m)
                    ch.ranks.add(msg.name)
                    metrics_seen = True
                elif isinstance(msg, NodeSummary):
                    for m in msg.metrics:
                        self._observe(m)
                    ch.ranks.update(c.name for c in msg.counts)
                    metrics_seen = metrics_seen or bool(msg.metrics)
                elif isinstance(msg, TelemetryBatch):
                    ch.ranks.update(t.name for t in msg.items)
                    ch.nodes = True
                elif isinstance(msg, Metric):
                    self._observe(msg)
                    ch.ranks.add(msg.name)
                    metrics_seen = True
                elif isinstance(msg, Telemetry):
                    ch.ranks.add(msg.name)
                    ch.nodes = True
                elif isinstance(msg, ProcStarted | ProcExited | ProcHung):
                    ch.ranks.add(msg.name)
                    ch.nodes = True
                    if isinstance(msg, ProcExited | ProcHung):
                        ch.failure = True
                elif isinstance(msg, Evidence | AgentError):
                    ch.failure = True
                else:
                    ch.nodes = True
            elif isinstance(ev, AttemptStarted):
                ch.structure = ch.nodes = ch.failure = True
                self.step_times.reset()
                self.series.new_attempt()
                if ev.attempt > 0:
                    for r in ev.ranks:
                        self.store.append(r.name, (f"──── attempt {ev.attempt} ────",))
            elif isinstance(ev, RunStarted):
                ch.structure = ch.nodes = True
            elif isinstance(ev, NodeUpdate):
                ch.nodes = True
                if ev.state is NodeState.LOST:  # its ranks are lost too: their rows change
                    ch.ranks.update(r.name for r in self.source.state.ranks.values() if r.node == ev.node)
            elif isinstance(ev, CheckReported | ChecksFinished):
                ch.checks = ch.nodes = True
            elif isinstance(ev, Stopping | AttemptEnded | Restarting | AwaitingOperator | RunFinished):
                ch.failure = ch.nodes = True
                text = _notice_text(ev)
                if text:
                    ch.notices.append(text)
                    self.notices.append(text)
            elif isinstance(ev, StandbyUpdated):
                ch.failure = True  # what r would do (warm or cold) is on the failure screen
                text = _notice_text(ev)
                if text:  # the Overview's notes, not a toast: no failure, and it comes every attempt
                    self.notices.append(text)
            elif isinstance(ev, Notice | ReplicaDivergence):
                text = _notice_text(ev)
                ch.notices.append(text)
                self.notices.append(text)
            elif isinstance(ev, StragglerFlagged | StragglerCleared):
                ch.ranks.add(ev.name)
        ch.events = n
        self.total_events += n
        self.store.flush()
        ch.metrics = metrics_seen
        found = self.source.state.stragglers()  # flagged ones that still run: a few names at most
        if found != self.stragglers:
            ch.ranks |= found ^ self.stragglers
            self.stragglers = found
            ch.stragglers = True
        return ch


def _notice_text(ev: Event) -> str:
    if isinstance(ev, Stopping):
        return f"stopping every rank: {ev.reason}"
    if isinstance(ev, AttemptEnded):
        return f"attempt {ev.attempt} {ev.outcome.value}: {ev.reason}"
    if isinstance(ev, Restarting):
        return (
            f"restarting the whole group as attempt {ev.attempt} in {ev.backoff_s:g} s "
            f"({ev.restarts_left} restart(s) left)"
        )
    if isinstance(ev, AwaitingOperator):
        return (
            f"{ev.reason}. The ranks are stopped, the nodes kept: r restarts the whole group "
            "(from its latest snapshot or checkpoint), q ends the run"
        )
    if isinstance(ev, RunFinished):
        return f"run {ev.result.status.value}, exit {ev.result.exit_code}: {ev.result.reason}"
    if isinstance(ev, Notice):
        return ev.text
    if isinstance(ev, ReplicaDivergence):
        return f"replicas diverged at step {ev.step}: {', '.join(ev.ranks)}"
    if isinstance(ev, StandbyUpdated) and ev.attempt == 0:  # the one a last run kept (Adopt)
        if ev.warm:
            return "the standby the last run of this job kept is ready on every node: attempt 0 starts warm"
        if not ev.ready:
            return f"{ev.node}: kept standby not taken ({ev.why}): attempt 0 starts cold"
    elif isinstance(ev, StandbyUpdated):
        if ev.warm:
            return (
                f"standby cluster for attempt {ev.attempt} ready on every node: "
                "a restart skips the cluster join"
            )
        if not ev.ready:
            return f"{ev.node}: standby for attempt {ev.attempt} lost ({ev.why}): a restart would be cold"
    return ""
