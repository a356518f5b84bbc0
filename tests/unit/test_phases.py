"""Where start-up time goes (console/engine/phases.py): events in, each attempt's AttemptPhases out."""

from __future__ import annotations

import json

import pytest
from mscon.agent.protocol import Milestone, ProcExited, ProcStarted, RankPhase
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptPhases,
    AttemptStarted,
    ChecksFinished,
    Event,
    JobState,
    NodeState,
    NodeUpdate,
    PhaseOrigin,
    RankRef,
    Restarting,
    RunFinished,
    RunResult,
    RunStarted,
    Stopping,
    from_json,
    to_json,
)
from mscon.console.engine.phases import describe_phases, phases_from_json, steps
from mscon.console.engine.state import ClusterState
from mscon.console.views.headless.reporter import format_summary

T0 = 1_700_000_000 * 10**9
NODES = ("a", "b")
REFS = (RankRef("sched", "a", -1), RankRef("r0", "a", 0), RankRef("r1", "b", 1))


def at(s: float) -> int:
    return T0 + round(s * 1e9)


def node(attempt: int, name: str, state: NodeState, s: float) -> NodeUpdate:
    return NodeUpdate(attempt, name, state, "", at(s))


def agent(attempt: int, msg: object) -> AgentEvent:
    return AgentEvent(attempt, msg)  # type: ignore[arg-type]


def started(attempt: int, name: str, s: float) -> AgentEvent:
    ref = next(r for r in REFS if r.name == name)
    return agent(attempt, ProcStarted(ref.node, name, ref.rank, 100, at(s), "/log"))


def phase(attempt: int, name: str, milestone: str, s: float) -> AgentEvent:
    ref = next(r for r in REFS if r.name == name)
    return agent(attempt, RankPhase(ref.node, name, ref.rank, milestone, at(s)))


def exited(
    attempt: int, name: str, s: float, signal: str | None = None, by_agent: bool = False
) -> AgentEvent:
    ref = next(r for r in REFS if r.name == name)
    code, signum = (None, 9 if signal == "SIGKILL" else 15) if signal else (0, None)
    return agent(attempt, ProcExited(ref.node, name, ref.rank, 100, code, signal, signum, at(s), by_agent))


def up_to_first_step(attempt: int, base: float) -> list[Event]:
    """The processes of an attempt launched at ``base`` s, each milestone of r0 then r1 (later)."""
    evs: list[Event] = [started(attempt, "sched", base + 0.1), started(attempt, "r0", base + 0.2)]
    evs.append(started(attempt, "r1", base + 0.3))
    for i, m in enumerate(("imported", "joined", "ready", "compiled", "first_step")):
        evs.append(phase(attempt, "r0", m, base + 1 + i))
        evs.append(phase(attempt, "r1", m, base + 1.5 + i))
    return evs


def launch() -> list[Event]:
    return [
        RunStarted(0, "run", "inv.yaml", NODES, 2, "/logs"),
        node(0, "a", NodeState.CONNECTING, 0.0),
        node(0, "b", NodeState.CONNECTING, 0.05),
        node(0, "a", NodeState.DEPLOYING, 0.4),
        node(0, "b", NodeState.DEPLOYING, 0.5),
        node(0, "a", NodeState.READY, 1.0),
        node(0, "b", NodeState.READY, 1.25),
        ChecksFinished(0, ts_ns=at(2.0)),
        AttemptStarted(0, REFS, "10.0.0.1", 8118, at(2.5)),
        node(0, "a", NodeState.RUNNING, 2.6),  # not a milestone
        *up_to_first_step(0, 2.5),
    ]


def fail_at(s: float) -> list[Event]:
    """Attempt 0: r1 is killed at ``s``, the rest stopped; ended with the state's verdict."""
    return [
        exited(0, "r1", s, "SIGKILL"),
        Stopping(0, "r1 failed", "r1", at(s + 0.05)),
        exited(0, "r0", s + 0.1, "SIGTERM", by_agent=True),
        exited(0, "sched", s + 0.2, "SIGTERM", by_agent=True),
    ]


def feed(evs: list[Event]) -> ClusterState:
    state = ClusterState()
    for ev in evs:
        state.apply(ev)
    return state


def end(state: ClusterState, s: float, outcome: AttemptOutcome = AttemptOutcome.FAILED) -> AttemptEnded:
    root = state.root_cause() if outcome is AttemptOutcome.FAILED else None
    return AttemptEnded(state.attempt.number, outcome, "why", root, at(s))  # type: ignore[union-attr]


def test_a_launch_is_timed_from_the_first_connection() -> None:
    p = feed(launch()).phases()
    assert p == AttemptPhases(
        origin=PhaseOrigin.LAUNCH,
        connected=pytest.approx(0.5),
        agent_up=pytest.approx(1.25),
        checks_done=pytest.approx(2.0),
        launched=pytest.approx(2.5),
        spawned=pytest.approx(2.8),  # the last process, the scheduler included
        imported=pytest.approx(4.0),  # the last worker (r1), never the first
        joined=pytest.approx(5.0),
        ready=pytest.approx(6.0),
        compiled=pytest.approx(7.0),
        first_step=pytest.approx(8.0),
    )
    labels = [label for label, _ in steps(p)]  # type: ignore[arg-type]
    assert labels == [
        "connected",
        "agents up",
        "checks",
        "launched",
        "spawned",
        "MindSpore imported",
        "cluster joined",
        "data ready",
        "compiled",
        "first step",
    ]
    assert [round(d, 2) for _, d in steps(p)] == [0.5, 0.75, 0.75, 0.5, 0.3, 1.2, 1, 1, 1, 1]  # type: ignore[arg-type]
    assert describe_phases(p).endswith("; 8.00 s to first step")  # type: ignore[arg-type]


def test_a_milestone_counts_once_every_worker_reached_it() -> None:
    evs = launch()
    evs = [
        e
        for e in evs
        if not (isinstance(e, AgentEvent) and e.msg.name == "r1" and e.msg.type == "rank_phase")
    ]
    state = feed(evs)
    p = state.phases()
    assert p is not None and (p.imported, p.joined, p.first_step) == (None, None, None)
    state.apply(phase(0, "r1", "imported", 3.5))
    state.apply(phase(0, "r1", "imported", 9.0))  # said twice (a replay): the first counts
    state.apply(phase(0, "sched", "joined", 9.0))  # the scheduler is not a worker
    state.apply(phase(0, "r1", "bogus", 9.0))  # a newer agent's milestone: ignored
    p = state.phases()
    assert p is not None and p.imported == pytest.approx(3.5) and p.joined is None


def test_an_unmodified_script_has_only_the_agents_milestones() -> None:
    evs = [e for e in launch() if not (isinstance(e, AgentEvent) and e.msg.type == "rank_phase")]
    evs += [phase(0, "r0", Milestone.FIRST_STEP, 9.0), phase(0, "r1", Milestone.FIRST_STEP, 9.5)]
    p = feed(evs).phases()
    assert p is not None and (p.imported, p.joined, p.ready, p.compiled) == (None,) * 4
    assert p.spawned == pytest.approx(2.8) and p.first_step == pytest.approx(9.5)
    assert [label for label, _ in steps(p)][-2:] == ["spawned", "first step"]


def test_a_restart_is_timed_from_the_fault() -> None:
    state = feed([*launch(), *fail_at(20.0)])
    state.apply(end(state, 20.3))
    state.apply(Restarting(1, "r1 failed", 2.0, 0))
    state.apply(AttemptStarted(1, REFS, "10.0.0.1", 8118, at(22.5)))
    for ev in up_to_first_step(1, 22.5):
        state.apply(ev)
    first, again = state.phases(state.attempts[0]), state.phases()
    assert first is not None and first.origin is PhaseOrigin.LAUNCH
    assert again == AttemptPhases(
        origin=PhaseOrigin.FAULT,
        detected=pytest.approx(0.05),
        stopped=pytest.approx(0.2),  # the scheduler, the last process to go
        launched=pytest.approx(2.5),
        spawned=pytest.approx(2.8),
        imported=pytest.approx(4.0),
        joined=pytest.approx(5.0),
        ready=pytest.approx(6.0),
        compiled=pytest.approx(7.0),
        first_step=pytest.approx(8.0),
    )
    assert [label for label, _ in steps(again)][:4] == ["stop detected", "all stopped", "backoff", "spawned"]
    assert describe_phases(again).startswith("from the fault: stop detected +0.05 s, all stopped +0.15 s")


def test_processes_the_agent_stopped_before_the_console_did_end_the_way_down_at_its_stop() -> None:
    """The agent stops a failed rank's siblings itself: their exits can precede the console's stop."""
    state = feed(
        [
            *launch(),
            exited(0, "r1", 20.0, "SIGKILL"),
            exited(0, "r0", 20.01, "SIGTERM", by_agent=True),
            exited(0, "sched", 20.02, "SIGTERM", by_agent=True),
            Stopping(0, "r1 failed", "r1", at(20.05)),
        ]
    )
    state.apply(end(state, 20.3))
    state.apply(AttemptStarted(1, REFS, "10.0.0.1", 8118, at(22.5)))
    p = state.phases()
    assert p is not None and p.detected == pytest.approx(0.05) and p.stopped == pytest.approx(0.05)
    assert describe_phases(p).startswith("from the fault: stop detected +0.05 s, all stopped +0.00 s")


def test_a_restart_with_no_fault_counts_from_the_stop_or_its_own_start() -> None:
    state = feed([*launch(), Stopping(0, "restart requested", None, at(20.0))])
    state.apply(exited(0, "r0", 20.1, "SIGTERM", by_agent=True))
    state.apply(end(state, 20.2, AttemptOutcome.RESTART_REQUESTED))
    state.apply(AttemptStarted(1, REFS, "10.0.0.1", 8118, at(21.0)))
    p = state.phases()
    assert p is not None and p.origin is PhaseOrigin.STOP and p.launched == pytest.approx(1.0)
    # A stop nobody timed (a console that does not stamp it): the attempt's own start.
    state.apply(Stopping(1, "restart requested", None))
    state.apply(end(state, 30.0, AttemptOutcome.RESTART_REQUESTED))
    state.apply(AttemptStarted(2, REFS, "10.0.0.1", 8118, at(31.0)))
    p = state.phases()
    assert p is not None and p.origin is PhaseOrigin.START and p.launched == 0.0
    assert (p.detected, p.stopped, p.connected) == (None, None, None)


def test_an_attached_console_ignores_its_own_connection() -> None:
    # An attach connects long after the attempt began (its start comes from the nodes' journals).
    evs: list[Event] = [
        RunStarted(0, "run", "inv.yaml", NODES, 2, "/logs"),
        node(0, "a", NodeState.CONNECTING, 100.0),
        node(0, "a", NodeState.READY, 100.5),
        AttemptStarted(0, REFS, "", 8118, at(2.5)),
        *up_to_first_step(0, 2.5),
    ]
    p = feed(evs).phases()
    assert p is not None and p.origin is PhaseOrigin.START
    assert (p.connected, p.agent_up, p.launched) == (None, None, 0.0)
    assert p.first_step == pytest.approx(5.5)


def test_the_summary_and_a_replay_carry_the_phases() -> None:
    state = feed([*launch(), *fail_at(20.0)])
    state.apply(end(state, 20.3))
    (summary,) = state.attempt_summaries()
    assert summary.phases == state.phases()
    result = RunResult(
        "run", JobState.FAILED, 137, "r1 failed", summary.root_cause, (), 21.0, "/logs", (summary,)
    )
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["attempts"][0]["phases"]["origin"] == "launch"
    assert phases_from_json(doc["attempts"][0]["phases"]) == summary.phases
    finished = from_json(json.loads(json.dumps(to_json(RunFinished(0, result)))))
    assert isinstance(finished, RunFinished) and finished.result.attempts[0].phases == summary.phases
    # A recording replays into the same breakdown.
    recorded = [from_json(json.loads(json.dumps(to_json(ev)))) for ev in [*launch(), *fail_at(20.0)]]
    assert feed(recorded).phases() == state.phases()
    # An older summary (no phases) still loads.
    del doc["attempts"][0]["phases"]
    old = from_json({"kind": "run_finished", "attempt": 0, "result": doc})
    assert isinstance(old, RunFinished) and old.result.attempts[0].phases is None
    text = format_summary(result)
    assert "start-up, per attempt" in text
    assert "  0: from the launch: connected +0.50 s, agents up +0.75 s" in text
    assert text.count("from the launch") == 1


def test_the_headless_summary_has_one_line_per_attempt() -> None:
    state = feed([*launch(), *fail_at(20.0)])
    state.apply(end(state, 20.3))
    state.apply(AttemptStarted(1, REFS, "10.0.0.1", 8118, at(22.5)))
    for ev in up_to_first_step(1, 22.5):
        state.apply(ev)
    state.apply(end(state, 40.0, AttemptOutcome.SUCCEEDED))
    attempts = state.attempt_summaries()
    result = RunResult("run", JobState.SUCCEEDED, 0, "all ranks finished", None, (), 40.0, "/logs", attempts)
    lines = format_summary(result).splitlines()
    at_ = lines.index("start-up, per attempt (each milestone when the last node or rank reached it):")
    assert [line[:20] for line in lines[at_ + 1 : at_ + 3]] == [
        "  0: from the launch",
        "  1: from the fault:",
    ]
    assert not lines[at_ + 3].startswith("  ")  # nothing more in that section
