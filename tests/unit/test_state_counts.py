"""ClusterState's counts and indexes (issue 44, the TUI at 10,000 nodes x 8 ranks): kept as the
events come, they must say what a scan of every rank, node and check says, after every event."""

from __future__ import annotations

from collections import Counter

from mscon.agent.protocol import (
    AllExited,
    LogBatch,
    Metric,
    MetricBatch,
    NodeSummary,
    ProcExited,
    ProcHung,
    ProcStarted,
)
from mscon.console.engine.events import (
    AgentEvent,
    AttemptStarted,
    CheckReported,
    CheckStatus,
    Event,
    NodeState,
    NodeUpdate,
    RankRef,
    RunStarted,
)
from mscon.console.engine.state import ClusterState

NODES = ("a", "b", "c")


def _refs(attempt: int) -> tuple[RankRef, ...]:
    workers = tuple(RankRef(f"r{i}", NODES[i // 4], i) for i in range(12))
    return (RankRef("sched", "a", -1), *workers)


def _exit(node: str, rank: int, code: int | None, by_agent: bool = False) -> AgentEvent:
    signal = None if code is not None else "SIGKILL"
    msg = ProcExited(node, f"r{rank}", rank, 100 + rank, code, signal, 9 if signal else None, 5, by_agent)
    return AgentEvent(0, msg)


def _run() -> list[Event]:
    evs: list[Event] = [RunStarted(0, "run", "inv.yaml", NODES, 12, "/tmp/x")]
    evs += [NodeUpdate(0, n, NodeState.CONNECTING) for n in NODES]
    evs += [NodeUpdate(0, n, NodeState.READY) for n in NODES]
    evs.append(NodeUpdate(0, "d", NodeState.UNREACHABLE, "not in the run's list"))  # a node never listed
    evs += [
        CheckReported(0, "a", "disk", CheckStatus.OK),
        CheckReported(0, "b", "disk", CheckStatus.FAIL),
        CheckReported(0, "b", "disk", CheckStatus.OK),  # the latest result counts
        CheckReported(0, "c", "gpu", CheckStatus.FAIL),
        CheckReported(0, "*", "skew", CheckStatus.FAIL),  # across nodes: no node's
    ]
    evs.append(AttemptStarted(0, _refs(0), "127.0.0.1", 1, 1))
    evs += [AgentEvent(0, ProcStarted(r.node, r.name, r.rank, 100, 2, "/tmp/l")) for r in _refs(0)]
    evs.append(AgentEvent(0, ProcStarted("a", "r0", 0, 100, 3, "/tmp/l")))  # the same rank again
    evs += [AgentEvent(0, LogBatch(NODES[i // 4], f"r{i}", i, 0, ("x",), 4)) for i in range(0, 12, 2)]
    # Steps: a rank's first, again, the scheduler's (not a worker), a node's summary with two
    evs.append(AgentEvent(0, MetricBatch("a", "r0", 0, (Metric("a", "r0", 0, 1), Metric("a", "r0", 0, 2)))))
    evs.append(AgentEvent(0, Metric("a", "sched", -1, 1)))
    evs.append(AgentEvent(0, NodeSummary("b", 4.0, (), (Metric("b", "r4", 4, 3), Metric("b", "r5", 5, 3)))))
    evs.append(_exit("a", 1, 0))
    evs.append(_exit("a", 2, 1))
    evs.append(_exit("b", 4, 0, by_agent=True))
    evs.append(AgentEvent(0, ProcHung("b", "r5", 5, 105, "stopped", "T (stopped)", 4, 6)))
    evs.append(NodeUpdate(0, "c", NodeState.LOST, "link down", 7))
    evs.append(AgentEvent(0, AllExited("a", 7)))
    evs.append(AttemptStarted(1, _refs(1), "127.0.0.1", 1, 8))  # a restart: counts start over
    evs += [AgentEvent(1, ProcStarted(r.node, r.name, r.rank, 200, 9, "/tmp/l")) for r in _refs(1)[:5]]
    return evs


def _scanned(st: ClusterState) -> tuple[object, ...]:
    workers = [r for r in st.ranks.values() if not r.is_scheduler]
    checks: dict[str, list[CheckReported]] = {}
    for (node, _), c in st.checks.items():
        checks.setdefault(node, []).append(c)
    return (
        dict(Counter(r.state for r in workers)),
        dict(Counter(v.state for v in st.nodes.values())),
        sum(r.started_ns is not None for r in workers),
        {n: [r.name for r in workers if r.node == n] for n in (*st.nodes, "z")},
        {n: sorted(c.name for c in cs) for n, cs in checks.items()},
        frozenset(n for n, cs in checks.items() if n != "*" and CheckStatus.FAIL in {c.status for c in cs}),
        len([n for n in checks if n != "*"]),
        sum(r.last_step is not None for r in workers),
        len(workers),
    )


def _counted(st: ClusterState) -> tuple[object, ...]:
    return (
        st.worker_states(),
        st.node_states(),
        st.workers_started(),
        {n: [r.name for r in st.workers_on(n)] for n in (*st.nodes, "z")},
        {n: sorted(c.name for c in st.checks_on(n)) for n in {n for n, _ in st.checks}},
        st.failing_nodes(),
        st.checked_nodes(),
        st.workers_stepped(),
        st.worker_count(),
    )


def test_the_counts_say_what_a_scan_says_after_every_event() -> None:
    st = ClusterState()
    for ev in _run():
        st.apply(ev)
        assert _counted(st) == _scanned(st), ev
    # and the run did go through the states the counts follow
    assert st.worker_states() == {"starting": 4, "pending": 8}
    assert st.attempts[0].failures and st.failing_nodes() == {"c"}


def test_workers_are_in_the_attempts_order_without_the_scheduler() -> None:
    st = ClusterState()
    for ev in _run()[:14]:
        st.apply(ev)
    assert [r.name for r in st.workers()] == [f"r{i}" for i in range(12)]
    assert st.workers() is not st.workers()  # a list of the caller's own
