"""Where start-up time goes: each attempt's milestones (``AttemptPhases``), from the events alone.

Part of ClusterState (it feeds ``PhaseClock``), so a recording replays into the same breakdown. A
launch counts from the console's first connection to a node; a restart from the fault that ended
the previous attempt (a hung rank: from its last progress), so its way down (stop detected, every
process gone) and its backoff are part of it. Milestones come from the events' own timestamps: the
console's clock up to the attempt's launch, the nodes' clocks from the processes' start on (the
ranks' own records for imported .. compiled, the agent's first metric for the first step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mscon.agent.protocol import GraphSource, Milestone, ProcStarted, RankPhase, is_scheduler
from mscon.console.engine.events import (
    AttemptEnded,
    AttemptPhases,
    AttemptStarted,
    GraphLoad,
    NodeState,
    NodeUpdate,
    PhaseOrigin,
)

# A rank's milestone (the wire's word) -> the AttemptPhases field it fills.
_RANK_FIELDS = {
    Milestone.IMPORTED: "imported",
    Milestone.JOINED: "joined",
    Milestone.READY: "ready",
    Milestone.COMPILED: "compiled",
    Milestone.FIRST_STEP: "first_step",
}
# Node states whose latest time is a milestone before an attempt's launch.
_NODE_FIELDS = {NodeState.DEPLOYING: "connected", NodeState.READY: "agent_up"}


@dataclass(slots=True)
class _Last:
    """When the last of a set of processes reached a milestone (each counted at its first report)."""

    seen: set[str] = field(default_factory=set)
    latest_ns: int = 0

    def add(self, name: str, ts_ns: int) -> None:
        if name not in self.seen:
            self.seen.add(name)
            self.latest_ns = max(self.latest_ns, ts_ns)

    def of(self, total: int) -> int | None:
        return self.latest_ns if total and len(self.seen) >= total else None


@dataclass(slots=True)
class _Attempt:
    origin: PhaseOrigin
    origin_ns: int
    before: dict[str, int]  # connected, agent_up, checks_done: within [origin, launch]
    launched_ns: int
    procs: frozenset[str]
    workers: frozenset[str]
    spawned: _Last = field(default_factory=_Last)
    ranks: dict[str, _Last] = field(default_factory=dict)  # AttemptPhases field -> its last worker
    # the way down, for the next attempt's breakdown
    stopping_ns: int = 0
    last_exit_ns: int = 0
    fault_ns: int | None = None
    warm: bool = False
    graphs: dict[str, str] = field(default_factory=dict)  # worker -> GraphSource (its first say)


class PhaseClock:
    """Fed by ClusterState's reducer; ``phases(n)`` is attempt n's breakdown so far."""

    def __init__(self) -> None:
        self._attempts: dict[int, _Attempt] = {}
        self._current: _Attempt | None = None
        # Milestones seen since the last attempt's launch, for the next one: field -> latest ts.
        self._pending: dict[str, int] = {}
        self._first_connect_ns: int | None = None

    # ------------------------------------------------------------ the console's events

    def node(self, ev: NodeUpdate) -> None:
        if not ev.ts_ns:
            return
        if ev.state is NodeState.CONNECTING and self._first_connect_ns is None and not self._attempts:
            self._first_connect_ns = ev.ts_ns
        name = _NODE_FIELDS.get(ev.state)
        if name is not None:
            self._pending[name] = max(self._pending.get(name, 0), ev.ts_ns)

    def checks_done(self, ts_ns: int) -> None:
        if ts_ns:
            self._pending["checks_done"] = ts_ns

    def started(self, ev: AttemptStarted) -> None:
        launched = ev.ts_ns
        prev = self._current
        if prev is None:
            origin, origin_ns = PhaseOrigin.LAUNCH, self._first_connect_ns
        elif prev.fault_ns:
            origin, origin_ns = PhaseOrigin.FAULT, prev.fault_ns
        else:
            origin, origin_ns = PhaseOrigin.STOP, prev.stopping_ns or None
        if origin_ns is None or not launched or origin_ns > launched:
            origin, origin_ns = PhaseOrigin.START, launched  # nothing earlier on a clock we can trust
        before = dict(self._pending)
        if prev is not None:
            # The agent stops a failed rank's node-local siblings itself, so the last exit can come a
            # moment before the console's stop: the way down ends no earlier than it began.
            stopped = max(prev.last_exit_ns, prev.stopping_ns) if prev.last_exit_ns else 0
            before["detected"], before["stopped"] = prev.stopping_ns, stopped
        # Only what happened between the origin and the launch (an attached console connects later).
        before = {k: ts for k, ts in before.items() if ts and origin_ns <= ts <= launched}
        self._pending = {}
        self._current = self._attempts[ev.attempt] = _Attempt(
            origin=origin,
            origin_ns=origin_ns,
            before=before,
            launched_ns=launched,
            procs=frozenset(r.name for r in ev.ranks),
            workers=frozenset(r.name for r in ev.ranks if not is_scheduler(r.rank)),
            warm=ev.warm,
        )

    def stopping(self, ts_ns: int) -> None:
        att = self._current
        if att is not None and ts_ns and not att.stopping_ns:
            att.stopping_ns = ts_ns

    def ended(self, ev: AttemptEnded) -> None:
        att = self._current
        if att is not None and ev.root_cause is not None and ev.root_cause.ts_ns:
            att.fault_ns = ev.root_cause.ts_ns

    # ------------------------------------------------------------ the agents' messages

    def spawned(self, msg: ProcStarted) -> None:
        att = self._current
        if att is not None and msg.name in att.procs:
            att.spawned.add(msg.name, msg.ts_ns)

    def exited(self, ts_ns: int) -> None:
        att = self._current
        if att is not None:
            att.last_exit_ns = max(att.last_exit_ns, ts_ns)

    def rank_phase(self, msg: RankPhase) -> None:
        att = self._current
        name = _RANK_FIELDS.get(msg.phase)
        if att is None or name is None or msg.name not in att.workers:
            return
        last = att.ranks.get(name)
        if last is None:
            last = att.ranks[name] = _Last()
        last.add(msg.name, msg.ts_ns)
        if msg.phase == Milestone.COMPILED and msg.graph in GraphSource.ALL:
            att.graphs.setdefault(msg.name, msg.graph)

    # ------------------------------------------------------------ the answer

    def phases(self, attempt: int) -> AttemptPhases | None:
        att = self._attempts.get(attempt)
        if att is None:
            return None
        t0 = att.origin_ns

        def rel(ts_ns: int | None) -> float | None:
            return None if not ts_ns else (ts_ns - t0) / 1e9

        workers = len(att.workers)
        ranks = {k: rel(last.of(workers)) for k, last in att.ranks.items()}
        return AttemptPhases(
            origin=att.origin,
            warm=att.warm,
            **{k: rel(ts) for k, ts in att.before.items()},
            launched=rel(att.launched_ns),
            spawned=rel(att.spawned.of(len(att.procs))),
            **ranks,
            graph=graph_load(att.graphs, workers),
        )


def graph_load(graphs: dict[str, str], workers: int) -> GraphLoad | None:
    """The attempt's GraphLoad from each worker's GraphSource: None until every worker said."""
    if not workers or len(graphs) < workers:
        return None
    said = set(graphs.values())
    if said == {GraphSource.LOADED}:
        return GraphLoad.LOADED
    if said == {GraphSource.COMPILED}:
        return GraphLoad.COMPILED
    return GraphLoad.MIXED


# ------------------------------------------------------------------ in words

# (field, label) in time order; a step is named by the milestone it ends at.
_STEPS = (
    ("detected", "stop detected"),
    ("stopped", "all stopped"),
    ("connected", "connected"),
    ("agent_up", "agents up"),
    ("checks_done", "checks"),
    ("launched", "launched"),
    ("spawned", "spawned"),
    ("imported", "MindSpore imported"),
    ("joined", "cluster joined"),
    ("ready", "data ready"),
    ("compiled", "compiled"),
    ("first_step", "first step"),
)
_FROM = {
    PhaseOrigin.LAUNCH: "from the launch",
    PhaseOrigin.FAULT: "from the fault",
    PhaseOrigin.STOP: "from the stop",
    PhaseOrigin.START: "from the attempt's start",
}


# The compiled milestone's name when the ranks said how their first step got its graph.
_GRAPH_LABELS = {
    GraphLoad.LOADED: "graph loaded (compile cache)",
    GraphLoad.COMPILED: "compiled",
    GraphLoad.MIXED: "compiled or loaded (some ranks each)",
}


def steps(p: AttemptPhases) -> list[tuple[str, float]]:
    """The known milestones in time order, each with the seconds it took after the one before (the
    first: after the origin). A restart's wait from its stop to its launch is its backoff; the
    compile step says whether the graph came from the compile cache."""
    out: list[tuple[str, float]] = []
    last, before = 0.0, ""
    for name, label in _STEPS:
        t = getattr(p, name)
        if t is None:
            continue
        if name == "launched" and before in ("detected", "stopped"):
            label = "backoff"
        if name == "compiled" and p.graph is not None:
            label = _GRAPH_LABELS[p.graph]
        out.append((label, t - last))
        last, before = t, name
    return out


def describe_graph(p: AttemptPhases) -> str | None:
    """How the attempt's first step got its graph, in words, with the seconds from data ready to
    the first step's end where both are known: "graph loaded from the compile cache (2.10 s)";
    None when the ranks did not say."""
    if p.graph is None:
        return None
    took = f" ({p.compiled - p.ready:.2f} s)" if p.compiled is not None and p.ready is not None else ""
    words = {
        GraphLoad.LOADED: "graph loaded from the compile cache",
        GraphLoad.COMPILED: "graph compiled",
        GraphLoad.MIXED: "graph loaded on some ranks, compiled on others",
    }
    return words[p.graph] + took


def describe_phases(p: AttemptPhases) -> str:
    """One line: "from the launch: connected +0.31 s, agents up +1.20 s, ..., first step +0.01 s;
    9.30 s to first step"."""
    done = steps(p)
    if not done:
        return f"{_FROM[p.origin]}: no milestone known"
    parts = ", ".join(f"{label} {d:+.2f} s" for label, d in done)
    total = sum(d for _, d in done)
    warm = " (warm: on the standby cluster)" if p.warm else ""
    return f"{_FROM[p.origin]}{warm}: {parts}; {total:.2f} s to {done[-1][0]}"


def phases_from_json(raw: dict) -> AttemptPhases:
    """An AttemptPhases from its JSON form (``summary.json``'s ``attempts[].phases``), for readers of
    the file such as the benches."""
    names = [name for name, _ in _STEPS]
    return AttemptPhases(
        origin=PhaseOrigin(raw["origin"]),
        warm=bool(raw.get("warm", False)),
        **{k: float(raw[k]) if raw.get(k) is not None else None for k in names},
        graph=GraphLoad(raw["graph"]) if raw.get("graph") is not None else None,
    )
