"""The supervisor's policy against in-process fake agents (tests/engine/fake_agent.py): no SSH, no
subprocess, each scenario in a fraction of a second.

Layout used throughout: node ``a`` (10.0.0.1) runs the scheduler ``sched`` and ranks r0, r1;
node ``b`` (10.0.0.2) runs r2, r3.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from fake_agent import (
    Blame,
    Exit,
    FakeCluster,
    Log,
    LogEvery,
    Lose,
    Met,
    NodeConfig,
    Script,
    Stopped,
    all_exit,
)
from mscon.agent import policy as policy_mod
from mscon.agent.protocol import (
    PROTOCOL_VERSION,
    Adopt,
    Inspect,
    LogBatch,
    Metric,
    ProcHung,
    ProcStarted,
    Resolve,
    Start,
    Stop,
)
from mscon.console.config.inventory import Inventory, load_inventory
from mscon.console.engine import exit_codes
from mscon.console.engine import session as session_mod
from mscon.console.engine import supervisor as supervisor_mod
from mscon.console.engine.clock import Clock, FakeClock
from mscon.console.engine.commands import RestartGroup, StopJob
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptStarted,
    AwaitingOperator,
    Event,
    FailureKind,
    JobState,
    LogsFetched,
    NodeState,
    NodeUpdate,
    Notice,
    RankState,
    Restarting,
    RunFinished,
    RunResult,
    RunStarted,
    StandbyUpdated,
    Stopping,
    from_json,
    to_json,
)
from mscon.console.engine.state import ClusterState
from mscon.console.engine.supervisor import RunOptions, Supervisor

E = TypeVar("E", bound=Event)

WORKERS = ("r0", "r1", "r2", "r3")
EVERYONE = ("sched", *WORKERS)  # the scheduler exits too: no linger
RUN_LIMIT_S = 8.0  # no scenario may take this long: a hung engine fails the test instead of the suite
PRODUCTION_TICK_S = supervisor_mod._TICK_S
PRODUCTION_LINGER_S = policy_mod.SCHEDULER_LINGER_S


@pytest.fixture(autouse=True)
def _fast_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the scenarios on the real clock, where a timer is not what they test: the scheduler that
    outlives its workers is stopped after 0.2 s instead of 5 s, and the supervisor's timers tick
    every 50 ms. The tests of timing rules take the ``clock`` fixture instead."""
    monkeypatch.setattr(policy_mod, "SCHEDULER_LINGER_S", 0.2)
    monkeypatch.setattr(supervisor_mod, "_TICK_S", 0.05)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The supervisor's clock, moved by the test (``advance``: past a limit, or to just before it to
    see that it still waits), with the production constants (``_fast_timers`` undone)."""
    monkeypatch.setattr(policy_mod, "SCHEDULER_LINGER_S", PRODUCTION_LINGER_S)
    monkeypatch.setattr(supervisor_mod, "_TICK_S", PRODUCTION_TICK_S)
    return FakeClock()


# ------------------------------------------------------------------ helpers


def make_inventory(
    tmp_path: Path,
    script: str = "train.py",
    job: dict[str, Any] | None = None,
    scheduler: dict[str, Any] | None = None,
    hosts: tuple[str, str] = ("10.0.0.1", "10.0.0.2"),
) -> Inventory:
    workdir = tmp_path / "wd"
    (workdir / script).parent.mkdir(parents=True, exist_ok=True)
    (workdir / script).write_text("print('a dummy script: the fake agents never run it')\n")
    doc = {
        "name": "fake",
        "device_target": "CPU",
        "nodes": [
            {"name": "a", "host": hosts[0], "devices": 2},
            {"name": "b", "host": hosts[1], "devices": 2},
        ],
        "scheduler": {"port": 8118, **(scheduler or {})},
        "job": {"workdir": str(workdir), "script": script, "args": ["--epochs", "1"], **(job or {})},
        "stop": {"grace_s": 1},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_inventory(path)


def make_cluster(
    tmp_path: Path, script: Script | Callable[[int], Script] | None = None, **nodes: NodeConfig
) -> FakeCluster:
    return FakeCluster(home_root=tmp_path / "homes", script=script or {}, nodes=dict(nodes))


@dataclass
class Run:
    result: RunResult
    events: list[Event]
    stamps: list[float]  # time.monotonic() when the test's sink saw each event
    sup: Supervisor
    cluster: FakeCluster
    wall: float

    def of(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]

    def agent(self, cls: type[Any]) -> list[Any]:
        return [e.msg for e in self.of(AgentEvent) if isinstance(e.msg, cls)]

    def lifecycle(self) -> list[str]:
        kinds = (RunStarted, AttemptStarted, Stopping, AttemptEnded, Restarting, RunFinished)
        return [e.kind for e in self.events if isinstance(e, kinds)]


async def run_job(
    tmp_path: Path,
    cluster: FakeCluster,
    inv: Inventory | None = None,
    *,
    max_restarts: int = 0,
    operator_wait_s: float | None = None,
    hang_s: float = 30.0,
    backoff_s: float = 0.0,
    during: Callable[[Supervisor], Awaitable[None]] | None = None,
    setup: Callable[[Supervisor], None] | None = None,
    clock: Clock | None = None,
) -> Run:
    inv = inv or make_inventory(tmp_path)
    options = RunOptions(
        logs_root=tmp_path / "runs", max_restarts=max_restarts, operator_wait_s=operator_wait_s
    )
    sup = Supervisor(inv, options, transport_factory=cluster, clock=clock)
    sup.hang_timeout_s = hang_s
    sup.backoff_s = backoff_s
    events: list[Event] = []
    stamps: list[float] = []

    def record(ev: Event) -> None:
        events.append(ev)
        stamps.append(time.monotonic())

    sup.bus.add_sink("test", record)
    if setup is not None:
        setup(sup)
    loop = asyncio.get_running_loop()
    side = loop.create_task(during(sup)) if during is not None else None
    t0 = time.monotonic()
    try:
        result = await asyncio.wait_for(sup.run(), RUN_LIMIT_S)
        if side is not None:  # what it checks after the step that ended the run still counts
            await asyncio.wait({side}, timeout=1.0)
    finally:
        if side is not None and not side.done():
            side.cancel()
    wall = time.monotonic() - t0
    if side is not None and side.done() and not side.cancelled():
        side.result()  # the operator task's own failure, if any
    return Run(result, events, stamps, sup, cluster, wall)


async def until(cond: Callable[[], bool], limit_s: float = 3.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def started_everywhere(cluster: FakeCluster, n: int = 5) -> Callable[[], bool]:
    """True once the fake agents reported ``n`` started processes."""
    return lambda: sum(isinstance(m, ProcStarted) for _, _, m in cluster.received) >= n


def one_line(text: str) -> bool:
    return "\n" not in text and "\r" not in text


# ------------------------------------------------------------------ 1. success


def workers_exited_ok(sup: Supervisor) -> Callable[[], bool]:
    return lambda: all(
        w in sup.state.ranks and sup.state.ranks[w].state is RankState.EXITED_OK for w in WORKERS
    )


async def test_success_and_the_lingering_scheduler_is_stopped(tmp_path: Path, clock: FakeClock) -> None:
    cluster = make_cluster(tmp_path, all_exit(WORKERS, at=0.05))  # the scheduler never exits by itself
    linger = policy_mod.SCHEDULER_LINGER_S

    async def time_passes(sup: Supervisor) -> None:
        await until(workers_exited_ok(sup))  # the linger starts now, on the fake clock
        await clock.advance(linger - 0.01)
        assert cluster.sent_of(Stop) == [], "the scheduler was stopped before its linger was over"
        await clock.advance(0.01 + PRODUCTION_TICK_S)  # the first tick past the linger
        assert {s.node for s in cluster.sent_of(Stop)} == {"a", "b"}

    run = await run_job(tmp_path, cluster, clock=clock, during=time_passes)
    r = run.result
    assert (r.exit_code, r.status, r.root_cause) == (0, JobState.SUCCEEDED, None)
    assert [(a.attempt, a.outcome) for a in r.attempts] == [(0, AttemptOutcome.SUCCEEDED)]
    assert run.lifecycle() == ["run_started", "attempt_started", "attempt_ended", "run_finished"]
    # The scheduler was stopped after the linger period (time_passes), not as a failure.
    stops = cluster.sent_of(Stop)
    assert {s.node for s in stops} == {"a", "b"}
    assert all(s.msg.reason == "scheduler outlived the workers" for s in stops)  # type: ignore[attr-defined]
    ranks = {x.name: x for x in r.ranks}
    assert ranks["sched"].status == "stopped (SIGTERM)" and ranks["sched"].role == ""
    assert all(ranks[w].status == "ok" for w in WORKERS)
    assert {f[0] for f in cluster.fetched} == {"a", "b"}
    assert [e.node for e in run.of(LogsFetched) if e.error is None] == ["a", "b"]
    assert run.wall < 1.5


# ------------------------------------------------------------------ 2. agents' clocks


async def test_root_cause_by_the_agents_clocks_not_arrival_order(tmp_path: Path) -> None:
    # r0 (node a) fails and is reported first; r2 (node b) failed 20 ms EARLIER by b's clock but
    # its report arrives 50 ms later (b is slow to carry out the Stop, so r2 is not our victim).
    script = {"r0": [Exit(0.03, code=1, ts=0.03)], "r2": [Exit(0.08, code=2, ts=0.01)]}
    cluster = make_cluster(tmp_path, script, b=NodeConfig(stop_delay_s=0.15))
    run = await run_job(tmp_path, cluster)
    (stopping,) = run.of(Stopping)
    assert stopping.trigger == "r0"  # what made us stop: the first to arrive
    (ended,) = run.of(AttemptEnded)
    root = ended.root_cause
    assert root is not None and (root.name, root.kind, root.detail) == ("r2", FailureKind.EXIT, "exit code 2")
    assert run.sup.state.root_cause() == root == run.result.root_cause
    assert run.result.exit_code == 2 and run.result.status is JobState.FAILED
    roles = {x.name: x.role for x in run.result.ranks}
    assert roles["r2"] == "root cause" and roles["r0"] == "victim"
    assert "r2 on b failed first (exit code 2)" in run.result.reason


# ------------------------------------------------------------------ 3. the scheduler is a witness


async def test_scheduler_naming_a_rank_is_a_witness_not_the_cause(tmp_path: Path) -> None:
    script = {"sched": [Blame(0.03, ranks=(1,)), Exit(0.06, code=1)], "r0": [LogEvery(0.0)]}
    cluster = make_cluster(tmp_path, script)
    run = await run_job(tmp_path, cluster)
    root = run.result.root_cause
    assert root is not None and root.name == "r1" and root.kind is FailureKind.NAMED
    assert root.detail == "named by MindSpore as the rank that stopped responding"
    assert root.evidence is not None and "first one timed out" in root.evidence
    assert run.result.exit_code == exit_codes.HUNG
    assert run.of(Stopping)[0].trigger == "sched"  # the trigger, not the verdict
    roles = {x.name: x.role for x in run.result.ranks}
    assert roles["r1"] == "root cause" and roles["sched"] != "root cause"


async def test_named_rank_that_also_failed_is_the_cause_with_its_own_code(tmp_path: Path) -> None:
    script = {"sched": [Blame(0.03, ranks=(1,)), Exit(0.06, code=1)], "r1": [Exit(0.1, code=6)]}
    cluster = make_cluster(tmp_path, script, a=NodeConfig(stop_delay_s=0.2))
    run = await run_job(tmp_path, cluster)
    root = run.result.root_cause
    assert root is not None and (root.name, root.kind, root.detail) == ("r1", FailureKind.EXIT, "exit code 6")
    assert root.evidence is not None and root.evidence.startswith("sched on a:")
    assert run.result.exit_code == 6


async def test_the_schedulers_blame_before_a_failure_counts_when_both_come_at_once(tmp_path: Path) -> None:
    """The console is too busy to read until every message of the script is in: the failure's alarm
    jumps the queue, and the blame line sent before it must still be weighed before the stop."""
    script = {"sched": [Blame(0.03, ranks=(1,)), Exit(0.06, code=1)], "r1": [Exit(0.1, code=6)]}
    cluster = make_cluster(tmp_path, script, a=NodeConfig(stop_delay_s=0.2, stall_after_start_s=0.15))
    run = await run_job(tmp_path, cluster)
    sent = [(type(m).__name__, getattr(m, "name", "")) for _, node, m in cluster.received if node == "a"]
    assert sent.index(("Evidence", "sched")) < sent.index(("ProcExited", "r1"))  # as an agent sends them
    root = run.result.root_cause
    assert root is not None and (root.name, root.detail) == ("r1", "exit code 6")
    assert root.evidence is not None and root.evidence.startswith("sched on a:")


async def test_scheduler_failing_alone_is_the_root_cause(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"sched": [Exit(0.05, code=3)], "r2": [LogEvery(0.0)]})
    run = await run_job(tmp_path, cluster)
    root = run.result.root_cause
    assert root is not None and (root.name, root.rank, root.kind) == ("sched", -1, FailureKind.EXIT)
    assert run.result.exit_code == 3
    assert run.result.reason.startswith("the scheduler on a failed first (exit code 3)")


# ------------------------------------------------------------------ 4. a stopped rank


async def test_stopped_rank_is_the_cause_and_later_errors_are_victims(tmp_path: Path) -> None:
    script = {
        "r0": [LogEvery(0.0, until=0.06), Exit(0.08, code=1)],
        "r1": [Log(0.0), Stopped(0.03)],
        "r2": [Exit(0.08, code=1)],
        "r3": [Exit(0.1, code=1)],
    }
    slow = NodeConfig(stop_delay_s=0.2)  # the peers fail on their own before the Stop lands
    cluster = make_cluster(tmp_path, script, a=slow, b=slow)
    run = await run_job(tmp_path, cluster)
    root = run.result.root_cause
    assert root is not None and (root.name, root.kind) == ("r1", FailureKind.STOPPED)
    assert root.code == exit_codes.HUNG == run.result.exit_code == 124
    assert run.of(Stopping)[0].trigger == "r1"
    assert [(m.name, m.why) for m in run.agent(ProcHung)] == [("r1", "stopped")]
    failures = run.sup.state.attempt.failures  # type: ignore[union-attr]
    assert {f.name for f in failures} == {"r0", "r1", "r2", "r3"}  # the peers did fail on their own...
    roles = {x.name: x.role for x in run.result.ranks}
    assert roles == {"sched": "victim", "r0": "victim", "r1": "root cause", "r2": "victim", "r3": "victim"}


# ------------------------------------------------------------------ 5. the hang timer


async def test_silent_rank_is_inspected_after_the_hang_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor_mod, "_TICK_S", PRODUCTION_TICK_S)
    timeout = 0.3
    script: dict[str, Any] = {n: [LogEvery(0.0, period=0.05)] for n in ("r0", "r2", "r3")}
    script["r1"] = [Log(0.0)]  # then silent
    cluster = make_cluster(tmp_path, script)
    run = await run_job(tmp_path, cluster, hang_s=timeout)
    inspects = cluster.sent_of(Inspect)
    assert [(s.node, s.msg.names) for s in inspects] == [("a", ("r1",))]  # type: ignore[attr-defined]
    (start_a,) = cluster.sent_of(Start, "a")
    assert timeout <= inspects[0].t - start_a.t < timeout + 1.0
    root = run.result.root_cause
    assert root is not None and (root.name, root.kind, root.code) == ("r1", FailureKind.HUNG, 124)
    assert root.detail == "no progress; process state S (sleeping), waiting in futex_wait_queue"
    assert [(m.name, m.why) for m in run.agent(ProcHung)] == [("r1", "no progress")]
    assert run.result.exit_code == 124
    assert run.of(Stopping)[0].trigger == "r1"


# ------------------------------------------------------------------ 6. the restart budget


async def test_restart_budget_used_up(tmp_path: Path, clock: FakeClock) -> None:
    inv = make_inventory(tmp_path, job={"resume_args": ["--resume-from", "last"]})
    cluster = make_cluster(tmp_path, {"r0": [Exit(0.03, code=3)]})
    backoff = 10.1  # between two ticks: a rule that fired a tick early would show
    restarted_at: list[float] = []

    async def time_passes(sup: Supervisor) -> None:
        for attempt in (1, 2):
            over = attempt  # attempts over so far
            await until(lambda n=over: sup.state.job is JobState.RESTARTING and len(sup.state.attempts) == n)
            began = clock.now()  # the backoff starts now: nothing moves the fake clock but us
            await clock.advance(backoff - 0.01)
            assert len(cluster.sent_of(Start, "a")) == attempt, "restarted before the backoff was over"
            await clock.advance(0.01 + PRODUCTION_TICK_S)  # the first tick past the backoff
            assert len(cluster.sent_of(Start, "a")) == attempt + 1
            restarted_at.append(clock.now() - began)

    run = await run_job(
        tmp_path, cluster, inv, max_restarts=2, backoff_s=backoff, clock=clock, during=time_passes
    )
    assert restarted_at == [pytest.approx(backoff + PRODUCTION_TICK_S)] * 2
    r = run.result
    assert [a.outcome for a in r.attempts] == [AttemptOutcome.FAILED] * 3
    assert r.exit_code == 3 and r.status is JobState.FAILED
    assert r.root_cause is not None and r.root_cause.name == "r0"
    assert r.reason.endswith("(after 2 restarts)")
    assert [(e.attempt, e.restarts_left) for e in run.of(Restarting)] == [(1, 1), (2, 0)]
    for node in ("a", "b"):
        starts = [s.msg for s in cluster.sent_of(Start, node)]
        assert [m.attempt for m in starts] == [0, 1, 2]  # type: ignore[attr-defined]
        for m in starts:
            for p in m.procs:  # type: ignore[attr-defined]
                tail = ("--epochs", "1") if m.attempt == 0 else ("--epochs", "1", "--resume-from", "last")
                assert p.argv[-len(tail) :] == tail and p.argv[1] == "train.py"
    assert run.lifecycle() == [
        "run_started",
        *["attempt_started", "stopping", "attempt_ended", "restarting"] * 2,
        *["attempt_started", "stopping", "attempt_ended"],
        "run_finished",
    ]


async def test_failed_attempt_then_a_successful_one(tmp_path: Path) -> None:
    def script(attempt: int) -> Script:
        return {"r3": [Exit(0.03, code=9)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(tmp_path, script)
    run = await run_job(tmp_path, cluster, max_restarts=3)
    r = run.result
    assert (r.exit_code, r.status, r.root_cause) == (0, JobState.SUCCEEDED, None)
    assert [(a.attempt, a.outcome) for a in r.attempts] == [
        (0, AttemptOutcome.FAILED),
        (1, AttemptOutcome.SUCCEEDED),
    ]
    assert r.attempts[0].root_cause is not None and r.attempts[0].root_cause.name == "r3"
    assert r.reason == "all ranks finished (after 1 restart)"
    assert [e.restarts_left for e in run.of(Restarting)] == [2]


async def test_trainer_checkpoints_from_attempt_0_and_resumes_from_attempt_1(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, script="trainer/train.py", job={"resume_args": ["--never"]})

    def script(attempt: int) -> Script:
        return {"r1": [Exit(0.03, code=1)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(tmp_path, script)
    run = await run_job(tmp_path, cluster, inv, max_restarts=1)
    assert run.result.exit_code == 0
    for node in ("a", "b"):
        run_dir = run.sup.session.run_dir(node)  # type: ignore[union-attr]
        s0, s1 = (s.msg for s in cluster.sent_of(Start, node))
        # Durable checkpoints, and a state copy in node memory every step (resume at the last step).
        added = ("--checkpoint-dir", f"{run_dir}/checkpoints", "--snapshot-every", "1")
        for p in s0.procs:  # type: ignore[attr-defined]
            assert p.argv[-4:] == added
            assert "--resume" not in p.argv and "--never" not in p.argv
        for p in s1.procs:  # type: ignore[attr-defined]
            assert p.argv[-5:] == (*added, "--resume")
            assert p.argv.count("--resume") == 1 and "--never" not in p.argv
    # A restart may follow attempt 0: its agents prepare spare processes (agent/spares.py), joined to
    # a standby cluster on CPU; none after attempt 1, which used the last restart of the budget.
    starts = [s.msg for s in cluster.sent_of(Start)]
    assert [(m.attempt, m.spares, m.join_standby) for m in starts] == [  # type: ignore[attr-defined]
        (0, True, True),
        (0, True, True),
        (1, False, True),
        (1, False, True),
    ]


async def test_trainer_without_restarts_gets_no_checkpoint_dir(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, script="trainer/train.py")
    cluster = make_cluster(tmp_path, all_exit(EVERYONE, 0.03))
    run = await run_job(tmp_path, cluster, inv, max_restarts=0)
    assert run.result.exit_code == 0
    for s in cluster.sent_of(Start):
        assert all("--checkpoint-dir" not in p.argv for p in s.msg.procs)  # type: ignore[attr-defined]
        assert all("--snapshot-every" not in p.argv for p in s.msg.procs)  # type: ignore[attr-defined]
        assert not s.msg.spares  # type: ignore[attr-defined]  # no restart can come: no spares


# ------------------------------------------------------------------ 7. RestartGroup


async def test_restart_group_does_not_use_the_budget(tmp_path: Path) -> None:
    def script(attempt: int) -> Script:
        return {"r0": [LogEvery(0.0)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(tmp_path, script)

    async def operator(sup: Supervisor) -> None:
        await until(started_everywhere(cluster))
        sup.submit(RestartGroup())

    run = await run_job(tmp_path, cluster, max_restarts=0, during=operator)
    r = run.result
    assert (r.exit_code, r.status) == (0, JobState.SUCCEEDED)
    assert [(a.attempt, a.outcome) for a in r.attempts] == [
        (0, AttemptOutcome.RESTART_REQUESTED),
        (1, AttemptOutcome.SUCCEEDED),
    ]
    assert r.attempts[0].root_cause is None
    (restarting,) = run.of(Restarting)
    assert (restarting.attempt, restarting.reason, restarting.restarts_left) == (1, "restart requested", 0)
    assert "the whole group restarts" in run.of(Stopping)[0].reason
    assert [s.msg.attempt for s in cluster.sent_of(Start, "b")] == [0, 1]  # type: ignore[attr-defined]


# ------------------------------------------------------------------ 7b. the operator decides after a failure


async def test_failed_run_waits_for_the_operator_who_restarts_it(tmp_path: Path, clock: FakeClock) -> None:
    """A live console with no budget left: the failed attempt stops, the run waits (long after every
    process of the attempt is gone), and the operator's restart trains again."""

    def script(attempt: int) -> Script:
        return {"r1": [Exit(0.03, code=7)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(tmp_path, script)

    async def operator(sup: Supervisor) -> None:
        await until(lambda: sup.state.job is JobState.AWAITING_OPERATOR)
        assert sup.state.attempt is not None and sup.state.attempt.outcome is AttemptOutcome.FAILED
        await clock.advance(3600.0)  # the operator reads the Failure panel: the run must still wait
        assert sup.state.job is JobState.AWAITING_OPERATOR
        sup.submit(RestartGroup())

    run = await run_job(tmp_path, cluster, operator_wait_s=math.inf, during=operator, clock=clock)
    r = run.result
    assert (r.exit_code, r.status) == (0, JobState.SUCCEEDED)
    assert [(a.attempt, a.outcome) for a in r.attempts] == [
        (0, AttemptOutcome.FAILED),
        (1, AttemptOutcome.SUCCEEDED),
    ]
    (waiting,) = run.of(AwaitingOperator)
    assert waiting.attempt == 0 and "r1 on a failed first (exit code 7)" in waiting.reason
    (restarting,) = run.of(Restarting)
    assert restarting.attempt == 1 and "operator" in restarting.reason and restarting.backoff_s == 0
    assert [s.msg.attempt for s in cluster.sent_of(Start, "b")] == [0, 1]  # type: ignore[attr-defined]


async def test_operator_wait_runs_out_into_the_failed_attempts_verdict(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A finite wait for the operator (a detached run's): until it is over the run waits, then it
    ends with the failed attempt's verdict."""
    cluster = make_cluster(tmp_path, {"r1": [Exit(0.03, code=7)]})
    wait_s = 120.1  # between two ticks

    async def nobody_comes(sup: Supervisor) -> None:
        await until(lambda: sup.state.job is JobState.AWAITING_OPERATOR)
        await clock.advance(wait_s - 0.01)
        assert sup.state.job is JobState.AWAITING_OPERATOR
        await clock.advance(0.01 + PRODUCTION_TICK_S)

    run = await run_job(tmp_path, cluster, operator_wait_s=wait_s, during=nobody_comes, clock=clock)
    r = run.result
    assert (r.exit_code, r.status) == (7, JobState.FAILED)
    assert r.root_cause is not None and r.root_cause.name == "r1"
    (waiting,) = run.of(AwaitingOperator)
    assert waiting.wait_s == wait_s
    assert [a.attempt for a in r.attempts] == [0]


@pytest.mark.parametrize("b_standby", ["ready", "lost"])
async def test_what_r_would_do_is_the_policys_word_on_the_standby(tmp_path: Path, b_standby: str) -> None:
    """Each node's standby for the next attempt is an event carrying the policy's verdict on the
    whole cluster (warm only once every node's has joined): the operator reads it before pressing
    r, and the restart is exactly that (AttemptStarted.warm, Start.warm on every node)."""

    def script(attempt: int) -> Script:
        return {"r1": [Exit(0.2, code=7)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(
        tmp_path,
        script,
        a=NodeConfig(standby="ready", standby_after_s=0.02),
        b=NodeConfig(standby=b_standby, standby_after_s=0.05),  # type: ignore[arg-type]
    )
    warm = b_standby == "ready"
    seen: list[tuple[bool, str]] = []

    async def operator(sup: Supervisor) -> None:
        await until(lambda: sup.state.job is JobState.AWAITING_OPERATOR)
        seen.append(sup.state.restart_outlook())
        sup.submit(RestartGroup())

    run = await run_job(tmp_path, cluster, operator_wait_s=math.inf, during=operator)
    assert run.result.status is JobState.SUCCEEDED
    said = [(u.node, u.ready, u.warm, u.why) for u in run.of(StandbyUpdated) if u.attempt == 1]
    lost_why = "the spare for r1 exited (SIGKILL)"
    assert said == [("a", True, False, ""), ("b", warm, warm, "" if warm else lost_why)]
    assert seen == [(True, "") if warm else (False, f"the standby on b is gone: {lost_why}")]
    assert [s.warm for s in run.of(AttemptStarted)] == [False, warm]
    for node in ("a", "b"):
        assert [s.msg.warm for s in cluster.sent_of(Start, node)] == [False, warm]  # type: ignore[attr-defined]


async def test_a_fault_while_every_standby_joins_waits_for_it_and_restarts_warm(tmp_path: Path) -> None:
    """Issue 43: a fault before the next attempt's spares have joined (soon after a warm restart,
    whose spares start at its first step). Every node said its spares are joining, so the restart
    waits for them (the policy's bound: no cold start timed here, STANDBY_WAIT_S) and starts warm;
    the joining words are no event of their own, and the summary marks the attempt warm."""

    def script(attempt: int) -> Script:
        return {"r1": [Exit(0.05, code=7)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    joining = {"standby": "ready", "standby_joining": True}
    cluster = make_cluster(
        tmp_path,
        script,
        a=NodeConfig(**joining, standby_after_s=0.4),  # type: ignore[arg-type]
        b=NodeConfig(**joining, standby_after_s=0.6),  # type: ignore[arg-type]
    )
    run = await run_job(tmp_path, cluster, max_restarts=1)
    r = run.result
    assert (r.status, [a.outcome for a in r.attempts]) == (
        JobState.SUCCEEDED,
        [AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED],
    )
    said = [(u.node, u.ready, u.warm) for u in run.of(StandbyUpdated) if u.attempt == 1]
    assert said == [("a", True, False)]  # b's word started attempt 1 at once: AttemptStarted says it
    assert [s.warm for s in run.of(AttemptStarted)] == [False, True]
    for node in ("a", "b"):
        assert [s.msg.warm for s in cluster.sent_of(Start, node)] == [False, True]  # type: ignore[attr-defined]
    assert [a.phases is not None and a.phases.warm for a in r.attempts] == [False, True]


async def test_operator_who_quits_a_waiting_run_gets_the_failed_attempts_verdict(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"r1": [Exit(0.03, code=7)]})

    async def operator(sup: Supervisor) -> None:
        await until(lambda: sup.state.job is JobState.AWAITING_OPERATOR)
        sup.submit(StopJob("stopped from the console (quit)"))

    run = await run_job(tmp_path, cluster, operator_wait_s=math.inf, during=operator)
    r = run.result
    assert (r.exit_code, r.status) == (7, JobState.FAILED)
    assert r.root_cause is not None and r.root_cause.name == "r1"
    assert [a.attempt for a in r.attempts] == [0]


async def test_headless_run_with_no_budget_ends_at_the_failure(tmp_path: Path) -> None:
    run = await run_job(tmp_path, make_cluster(tmp_path, {"r1": [Exit(0.03, code=7)]}))
    assert (run.result.exit_code, run.result.status) == (7, JobState.FAILED)
    assert run.of(AwaitingOperator) == []


async def test_restart_pressed_while_the_failed_attempt_stops_restarts_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    """r during the failure's stop (b never confirms it, so the stop lasts until b is cut off): once
    the attempt is over the group goes again, headless and with no budget (the operator's restart
    uses none)."""

    def script(attempt: int) -> Script:
        return {"r1": [Exit(0.03, code=7)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(tmp_path, script, b=NodeConfig(on_stop="ignore"))

    async def operator(sup: Supervisor) -> None:
        await until(lambda: sup.state.job is JobState.STOPPING)
        sup.submit(RestartGroup())
        # time moves only while every task waits on the clock: here, until b is cut off
        moved = await clock.run_until(lambda: len(cluster.sent_of(Start, "b")) == 2, limit_s=60.0)
        assert moved > sup.inv.stop.grace_s + policy_mod.STOP_CONFIRM_S

    run = await run_job(tmp_path, cluster, during=operator, clock=clock)
    assert (run.result.exit_code, run.result.status) == (0, JobState.SUCCEEDED)
    assert [a.outcome for a in run.result.attempts] == [AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED]


# ------------------------------------------------------------------ 8. StopJob


async def test_stop_job_reaches_every_node_promptly(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"r0": [LogEvery(0.0)]})
    asked: list[float] = []

    async def operator(sup: Supervisor) -> None:
        await until(started_everywhere(cluster))
        asked.append(time.monotonic())
        sup.submit(StopJob())

    run = await run_job(tmp_path, cluster, during=operator)
    r = run.result
    assert (r.exit_code, r.status) == (130, JobState.INTERRUPTED)
    assert [a.outcome for a in r.attempts] == [AttemptOutcome.INTERRUPTED]
    assert r.root_cause is None
    stops = cluster.sent_of(Stop)
    assert sorted(s.node for s in stops) == ["a", "b"]
    assert all(0 <= s.t - asked[0] < 0.2 for s in stops)
    assert all(x.status == "stopped (SIGTERM)" for x in r.ranks)


async def test_second_stop_job_forces_when_a_node_never_confirms(tmp_path: Path, clock: FakeClock) -> None:
    cluster = make_cluster(tmp_path, b=NodeConfig(on_stop="ignore"))
    second: list[float] = []

    async def operator(sup: Supervisor) -> None:
        await until(started_everywhere(cluster))
        sup.submit(StopJob())
        await clock.advance(sup.inv.stop.grace_s + 1.0)  # b has not confirmed: the stop goes on
        assert sup.state.job is JobState.STOPPING and not cluster.channel("b").ended
        second.append(time.monotonic())
        forced_at = clock.now()
        sup.submit(StopJob("again"))
        await until(lambda: cluster.channel("b").ended)
        assert clock.now() == forced_at  # at once: not the confirmation wait

    run = await run_job(tmp_path, cluster, during=operator, clock=clock)
    r = run.result
    assert (r.exit_code, r.status) == (130, JobState.INTERRUPTED)
    assert r.reason == "stop requested"  # the first StopJob's
    assert cluster.channel("b").ended and not cluster.channel("b").lost  # cut by the console
    ended_at = run.stamps[run.events.index(run.of(AttemptEnded)[0])]
    assert ended_at - second[0] < 0.5  # not the grace period plus the 15 s confirmation wait


async def test_restart_pressed_while_the_operators_stop_runs_is_refused_with_a_notice(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The policy refuses it (``RestartRefused``); the console says so and the stop goes on."""
    cluster = make_cluster(tmp_path, b=NodeConfig(on_stop="ignore"))
    events: list[Any] = []  # as the views see them, while the run goes on

    async def operator(sup: Supervisor) -> None:
        await until(started_everywhere(cluster))
        sup.submit(StopJob())
        await until(lambda: sup.state.job is JobState.STOPPING)
        sup.submit(RestartGroup())
        await until(lambda: any(isinstance(e, Notice) for e in events))
        sup.submit(StopJob("again"))  # b never confirms: the second stop ends it

    run = await run_job(
        tmp_path,
        cluster,
        during=operator,
        clock=clock,
        setup=lambda sup: sup.bus.add_sink("notices", events.append),
    )
    assert (run.result.exit_code, run.result.status) == (130, JobState.INTERRUPTED)
    assert [n.text for n in run.of(Notice)] == ["cannot restart now: the run is stopping"]
    assert len(run.of(AttemptStarted)) == 1


@pytest.mark.parametrize("code", [130, 141])
async def test_stop_job_exit_code(tmp_path: Path, code: int) -> None:
    cluster = make_cluster(tmp_path)

    async def operator(sup: Supervisor) -> None:
        await until(started_everywhere(cluster))
        sup.submit(StopJob("output closed (stdout)", code) if code == 141 else StopJob())

    run = await run_job(tmp_path, cluster, during=operator)
    assert run.result.exit_code == code and run.result.status is JobState.INTERRUPTED


async def test_stop_job_before_the_run_starts_is_honoured(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path)
    run = await run_job(tmp_path, cluster, setup=lambda sup: sup.submit(StopJob()))
    assert (run.result.exit_code, run.result.status) == (130, JobState.INTERRUPTED)
    assert cluster.sent_of(Start) == [] and run.of(AttemptStarted) == []


async def test_stop_job_during_backoff_ends_the_run(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"r0": [Exit(0.02, code=5)]})

    async def operator(sup: Supervisor) -> None:
        await until(lambda: bool(sup.state.attempts) and sup.state.job is JobState.RESTARTING)
        sup.submit(StopJob())

    run = await run_job(tmp_path, cluster, max_restarts=5, backoff_s=5.0, during=operator)
    assert (run.result.exit_code, run.result.status) == (130, JobState.INTERRUPTED)
    assert len(run.result.attempts) == 1 and run.wall < 2.0


async def test_restart_group_during_backoff_cuts_it_short(tmp_path: Path) -> None:
    def script(attempt: int) -> Script:
        return {"r0": [Exit(0.02, code=5)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(tmp_path, script)

    async def operator(sup: Supervisor) -> None:
        await until(lambda: bool(sup.state.attempts) and sup.state.job is JobState.RESTARTING)
        sup.submit(RestartGroup())

    run = await run_job(tmp_path, cluster, max_restarts=1, backoff_s=30.0, during=operator)
    assert (run.result.exit_code, run.result.status) == (0, JobState.SUCCEEDED)
    assert len(run.result.attempts) == 2 and run.wall < 3.0  # not the 30 s backoff


# ------------------------------------------------------------------ 9. a lost node


async def test_lost_node_stops_the_others(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"r2": [Log(0.0), Lose(0.05)], "r0": [LogEvery(0.0)]})
    run = await run_job(tmp_path, cluster)
    r = run.result
    assert r.exit_code == exit_codes.UNREACHABLE == 4 and r.status is JobState.FAILED
    assert r.root_cause is not None
    assert (r.root_cause.name, r.root_cause.kind, r.root_cause.code) == ("b", FailureKind.NODE_LOST, 4)
    assert r.root_cause.detail.startswith("lost the node b")
    lost = [e for e in run.of(NodeUpdate) if e.state is NodeState.LOST]
    assert lost and {e.node for e in lost} == {"b"}
    assert run.of(Stopping)[0].trigger == "b"
    lost_t = next(t for t, e in zip(run.stamps, run.events, strict=True) if e in lost)
    stops = cluster.sent_of(Stop)
    assert [s.node for s in stops] == ["a"] and stops[0].t - lost_t < 0.2
    statuses = {x.name: x.status for x in r.ranks}
    assert statuses["r2"] == statuses["r3"] == "lost"


async def test_lost_node_is_reopened_for_the_next_attempt(tmp_path: Path) -> None:
    def script(attempt: int) -> Script:
        return {"r3": [Lose(0.05)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(tmp_path, script)
    run = await run_job(tmp_path, cluster, max_restarts=1)
    r = run.result
    assert (r.exit_code, r.status) == (0, JobState.SUCCEEDED)
    assert (cluster.factory_calls("a"), cluster.factory_calls("b")) == (1, 2)
    first = r.attempts[0]
    assert first.outcome is AttemptOutcome.FAILED
    assert first.root_cause is not None and first.root_cause.kind is FailureKind.NODE_LOST
    assert [s.msg.attempt for s in cluster.sent_of(Start, "b")] == [0, 1]  # type: ignore[attr-defined]
    assert len(cluster.transports["b"][-1].channel.sent) > 0  # type: ignore[union-attr]


async def test_a_node_that_cannot_be_reopened_is_a_lost_node_to_the_policy(tmp_path: Path) -> None:
    """A failed reopen on restart does not end the run in the supervisor (issue 34): the node is
    lost for the attempt, the policy stops it, and the budget decides whether another follows."""
    cluster: FakeCluster | None = None

    def script(attempt: int) -> Script:
        assert cluster is not None
        if attempt > 0:
            return all_exit(EVERYONE, 0.03)
        cluster.nodes["b"] = NodeConfig(connect_error="connection refused")  # from now on
        return {"r3": [Lose(0.05)]}

    cluster = make_cluster(tmp_path, script)
    run = await run_job(tmp_path, cluster, max_restarts=2)
    r = run.result
    assert (r.status, r.exit_code) == (JobState.FAILED, exit_codes.UNREACHABLE)
    assert [a.outcome for a in r.attempts] == [AttemptOutcome.FAILED] * 3  # the budget, used up
    for later in r.attempts[1:]:
        root = later.root_cause
        assert root is not None and (root.kind, root.node) == (FailureKind.NODE_LOST, "b")
        assert "connection refused" in root.detail
    assert cluster.factory_calls("b") == 3  # reopened for each restart
    assert [s.msg.attempt for s in cluster.sent_of(Start, "b")] == [0]  # type: ignore[attr-defined]
    assert {s.msg.attempt for s in cluster.sent_of(Start, "a")} == {0, 1, 2}  # type: ignore[attr-defined]
    assert "connection refused" in r.reason


# ------------------------------------------------------------------ 10. protocol and hello


async def test_protocol_mismatch_is_unreachable_in_one_line(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, b=NodeConfig(protocol=1))
    run = await run_job(tmp_path, cluster)
    r = run.result
    assert (r.exit_code, r.status) == (exit_codes.UNREACHABLE, JobState.UNREACHABLE)
    assert one_line(r.reason) and r.reason.startswith("b: ")
    assert "protocol 1" in r.reason and f"console {PROTOCOL_VERSION}" in r.reason
    assert cluster.sent_of(Start) == []
    assert [e.node for e in run.of(NodeUpdate) if e.state is NodeState.UNREACHABLE] == ["b"]


async def test_agent_that_never_says_hello(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_mod, "HELLO_TIMEOUT_S", 0.2)
    cluster = make_cluster(tmp_path, a=NodeConfig(hello=False, stderr="sh: python3: not found\n"))
    run = await run_job(tmp_path, cluster)
    assert run.result.exit_code == exit_codes.UNREACHABLE
    assert one_line(run.result.reason)
    assert run.result.reason == "a: the agent did not start with python3: sh: python3: not found"


# ------------------------------------------------------------------ 11. sinks


async def test_a_raising_sink_is_detached_and_the_run_goes_on(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"r0": [Exit(0.05, code=3)]})

    def broken(ev: Event) -> None:
        if isinstance(ev, AttemptStarted):
            raise RuntimeError("view bug")

    run = await run_job(tmp_path, cluster, setup=lambda sup: sup.bus.add_sink("broken", broken))
    assert run.result.exit_code == 3
    notices = [n.text for n in run.of(Notice)]
    assert any(
        "the broken view was detached: its handler raised RuntimeError: view bug" in t for t in notices
    )
    assert run.lifecycle()[-1] == "run_finished"


async def test_detach_notice_carries_the_current_attempt(tmp_path: Path) -> None:
    def script(attempt: int) -> Script:
        return {"r0": [Exit(0.02, code=1)]} if attempt == 0 else all_exit(EVERYONE, 0.02)

    def broken(ev: Event) -> None:
        if isinstance(ev, AttemptStarted) and ev.attempt == 1:
            raise RuntimeError("view bug")

    cluster = make_cluster(tmp_path, script)
    run = await run_job(tmp_path, cluster, max_restarts=1, setup=lambda sup: sup.bus.add_sink("b", broken))
    (notice,) = run.of(Notice)
    assert notice.attempt == 1


async def test_a_slow_sink_loses_metrics_only(tmp_path: Path) -> None:
    script: dict[str, Any] = {
        n: [*(Met(0.001 * i, step=i) for i in range(40)), Log(0.05, ("line",)), Exit(0.06)] for n in WORKERS
    }
    cluster = make_cluster(tmp_path, script)
    gate = asyncio.Event()
    slow: list[Event] = []

    async def stuck(ev: Event) -> None:
        await gate.wait()  # set only once the run has finished: it lags for the whole run
        slow.append(ev)

    def setup(sup: Supervisor) -> None:
        sup.bus.add_sink("slow", stuck, lag_limit=3)
        sup.bus.add_sink("opener", lambda ev: gate.set() if isinstance(ev, RunFinished) else None)

    run = await run_job(tmp_path, cluster, setup=setup)
    assert run.result.exit_code == 0 and run.wall < 2.0
    metrics = [e for e in run.events if isinstance(e, AgentEvent) and isinstance(e.msg, Metric)]
    slow_metrics = [e for e in slow if isinstance(e, AgentEvent) and isinstance(e.msg, Metric)]
    assert len(metrics) == 160
    (dropped,) = run.result.dropped
    assert dropped[0] == "slow" and dropped[1] > 0
    assert len(metrics) - len(slow_metrics) == dropped[1]
    # Every log batch and lifecycle event reached the slow sink, in order; only metrics were lost.
    kept = [e for e in run.events if not (isinstance(e, AgentEvent) and isinstance(e.msg, Metric))]
    assert [e for e in slow if e in kept or not isinstance(e, AgentEvent | Notice)] == kept
    assert len([e for e in slow if isinstance(e, AgentEvent) and isinstance(e.msg, LogBatch)]) == 4


async def test_a_sink_that_never_returns_does_not_hold_the_end_of_the_run(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, all_exit(EVERYONE, 0.02))
    never = asyncio.Event()

    async def stuck(ev: Event) -> None:
        await never.wait()

    inv = make_inventory(tmp_path)
    sup = Supervisor(inv, RunOptions(logs_root=tmp_path / "runs"), transport_factory=cluster)
    sup.bus.add_sink("stuck", stuck, lag_limit=2)
    await asyncio.wait_for(sup.run(), 0.6)  # TimeoutError while the bus drains for 10 s


# ------------------------------------------------------------------ 13. MS_SCHED_HOST


def _sched_hosts(cluster: FakeCluster) -> set[str]:
    return {p.env["MS_SCHED_HOST"] for s in cluster.sent_of(Start) for p in s.msg.procs}  # type: ignore[attr-defined]


async def test_sched_host_defaults_to_the_address_the_first_agent_was_reached_on(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, all_exit(EVERYONE, 0.02), a=NodeConfig(ssh_addr="192.168.7.1"))
    run = await run_job(tmp_path, cluster)
    assert run.result.exit_code == 0
    assert _sched_hosts(cluster) == {"192.168.7.1"}
    assert run.of(AttemptStarted)[0].sched_host == "192.168.7.1"
    assert cluster.sent_of(Resolve) == []


async def test_sched_host_name_is_resolved_by_the_first_agent(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, scheduler={"host": "head-node"})
    cluster = make_cluster(tmp_path, all_exit(EVERYONE, 0.02))
    cluster.resolve["head-node"] = "10.9.8.7"
    run = await run_job(tmp_path, cluster, inv)
    assert run.result.exit_code == 0
    assert _sched_hosts(cluster) == {"10.9.8.7"}
    assert [(s.node, s.msg.host) for s in cluster.sent_of(Resolve)] == [("a", "head-node")]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("host", "resolves_to", "expect"),
    [("10.0.0.1", None, "10.0.0.1"), ("node-a", "10.1.1.1", "10.1.1.1"), ("node-a", None, None)],
)
async def test_sched_host_without_ssh_connection_falls_back_to_the_first_host(
    tmp_path: Path, host: str, resolves_to: str | None, expect: str | None
) -> None:
    inv = make_inventory(tmp_path, hosts=(host, "10.0.0.2"))
    cluster = make_cluster(tmp_path, all_exit(EVERYONE, 0.02), a=NodeConfig(ssh_addr=""))  # no SSH_CONNECTION
    if resolves_to is not None:
        cluster.resolve[host] = resolves_to
    run = await run_job(tmp_path, cluster, inv)
    if expect is not None:
        assert run.result.exit_code == 0 and _sched_hosts(cluster) == {expect}
        assert len(cluster.sent_of(Resolve)) == (0 if host == expect else 1)
    else:  # a host name nobody can resolve: the node is as good as unreachable
        assert run.result.exit_code == exit_codes.UNREACHABLE and cluster.sent_of(Start) == []
        assert (
            one_line(run.result.reason) and "nodes[0].host (a): cannot resolve 'node-a'" in run.result.reason
        )


async def test_unresolvable_sched_host_is_a_usage_error_and_nothing_starts(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, scheduler={"host": "head-node"})
    cluster = make_cluster(tmp_path)
    run = await run_job(tmp_path, cluster, inv)
    r = run.result
    assert r.exit_code == exit_codes.USAGE == 2
    assert one_line(r.reason) and "scheduler.host" in r.reason and "'head-node'" in r.reason
    assert "Name or service not known" in r.reason
    assert cluster.sent_of(Start) == [] and run.of(AttemptStarted) == []


# ------------------------------------------------------------------ 12. events: JSON and replay


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN included (floats round-trip exactly: see test_floats_round_trip_exactly)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            _same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, enum.Enum):
        return type(a) is type(b) and a == b
    return type(a) is type(b) and a == b


def _round_trip(ev: Event) -> Event:
    return from_json(json.loads(json.dumps(to_json(ev))))


async def _scenarios(tmp_path: Path) -> list[Run]:
    """Runs that between them produce every event kind and every wire message an attempt can hold."""

    def named_hung_ok(attempt: int) -> Script:
        if attempt == 0:  # replicas disagree (r3), the scheduler names r1 and fails
            sums = {"r0": "aa", "r1": "aa", "r2": "aa", "r3": "bb"}
            out: dict[str, Any] = {
                n: [Met(0.0, 1, 0.5, checksum=c), Log(0.0, ("x",))] for n, c in sums.items()
            }
            out["sched"] = [Blame(0.02, ranks=(1,)), Exit(0.04, code=1)]
            return out
        if attempt == 1:  # r1 falls silent
            return {"r1": [Log(0.0)], "r0": [LogEvery(0.0)], "r2": [LogEvery(0.0)], "r3": [LogEvery(0.0)]}
        return all_exit(EVERYONE, 0.02)

    def broken(ev: Event) -> None:
        if isinstance(ev, AttemptEnded):
            raise RuntimeError("view bug")

    async def stop(sup: Supervisor) -> None:
        await until(lambda: sup.state.job is JobState.RUNNING)
        sup.submit(StopJob())

    runs = []
    cluster = make_cluster(tmp_path / "s1", named_hung_ok)
    runs.append(await run_job(tmp_path / "s1", cluster, max_restarts=3, hang_s=0.1))
    cluster = make_cluster(tmp_path / "s2", {"r1": [Stopped(0.02)], "r0": [Exit(0.05, signal="SIGKILL")]})
    runs.append(await run_job(tmp_path / "s2", cluster, setup=lambda sup: sup.bus.add_sink("bad", broken)))
    cluster = make_cluster(tmp_path / "s3", b=NodeConfig(protocol=1))
    runs.append(await run_job(tmp_path / "s3", cluster))
    cluster = make_cluster(tmp_path / "s4")
    runs.append(await run_job(tmp_path / "s4", cluster, during=stop))
    cluster = make_cluster(tmp_path / "s5", {"r2": [Lose(0.03)]})
    runs.append(await run_job(tmp_path / "s5", cluster))
    return runs


async def test_events_round_trip_and_replay_into_the_same_state(tmp_path: Path) -> None:
    runs = await _scenarios(tmp_path)
    kinds: set[str] = set()
    wire: set[str] = set()
    for run in runs:
        for ev in run.events:
            back = _round_trip(ev)
            assert _same(ev, back), ev
            kinds.add(ev.kind)
            if isinstance(ev, AgentEvent):
                wire.add(ev.msg.type)
        replayed = ClusterState()
        for ev in run.events:
            replayed.apply(_round_trip(ev))
        live = run.sup.state
        assert {n: r.state for n, r in replayed.ranks.items()} == {n: r.state for n, r in live.ranks.items()}
        assert {n: v.state for n, v in replayed.nodes.items()} == {n: v.state for n, v in live.nodes.items()}
        assert replayed.root_cause() == live.root_cause()
        assert replayed.attempt_summaries() == live.attempt_summaries()
        assert replayed.divergent == live.divergent
        assert replayed.job == live.job == run.result.status
    assert kinds >= {
        "run_started",
        "node",
        "attempt_started",
        "agent",
        "stopping",
        "attempt_ended",
        "restarting",
        "notice",
        "divergence",
        "logs_fetched",
        "run_finished",
    }
    assert wire >= {"proc_started", "log", "metric", "proc_exited", "proc_hung", "evidence", "all_exited"}
    roots = [a.root_cause for a in runs[0].result.attempts]
    assert [(f.name, f.kind) for f in roots if f is not None] == [
        ("r1", FailureKind.NAMED),
        ("r1", FailureKind.HUNG),
    ]
    assert runs[0].result.divergent_ranks == ("r3",) and runs[0].result.exit_code == 0
    assert [r.result.exit_code for r in runs[1:]] == [124, 4, 130, 4]


def test_floats_round_trip_exactly() -> None:
    msg = Metric(node="a", name="r0", rank=0, step=1, loss=2.302585092994046, ts=1732371234.1234567)
    ev = AgentEvent(0, msg)
    assert _round_trip(ev) == ev


# ------------------------------------------------------------------ engine bugs found with the fakes


async def test_node_that_never_confirms_its_stop_is_cut_off_and_reopened(
    tmp_path: Path, clock: FakeClock
) -> None:
    inv = make_inventory(tmp_path)
    limit = inv.stop.grace_s + policy_mod.STOP_CONFIRM_S

    def script(attempt: int) -> Script:
        return {"r0": [Exit(0.03, code=1)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    # b's agent never carries out a Stop (wedged in D state, say); a fresh agent would be fine
    cluster = make_cluster(tmp_path, script, b=NodeConfig(on_stop="ignore"))

    async def time_passes(sup: Supervisor) -> None:
        await until(lambda: bool(cluster.sent_of(Stop, "b")))  # the stop's wait starts now
        await clock.advance(limit - 0.01)
        first_b = cluster.transports["b"][0].channel
        assert first_b is not None and not first_b.ended, "cut off before its grace and confirmation wait"
        assert cluster.factory_calls("b") == 1
        await clock.advance(0.01 + PRODUCTION_TICK_S)
        assert cluster.transports["b"][0].channel.ended  # type: ignore[union-attr]

    run = await run_job(tmp_path, cluster, inv, max_restarts=1, during=time_passes, clock=clock)
    first_lost = next(e for e in run.of(NodeUpdate) if e.state is NodeState.LOST)
    assert (first_lost.attempt, first_lost.node, first_lost.detail) == (
        0,
        "b",
        "did not confirm the stop in time",
    )
    assert cluster.transports["b"][0].channel.ended  # type: ignore[union-attr]  # cut off by the console
    assert cluster.factory_calls("b") == 2  # and reopened for attempt 1
    assert run.result.exit_code == 0, run.result.reason


async def test_stop_job_while_resolving_the_scheduler_starts_nothing(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, scheduler={"host": "head-node"})
    cluster = make_cluster(tmp_path, a=NodeConfig(resolve_delay_s=0.3))  # a slow DNS on node a
    cluster.resolve["head-node"] = "10.9.8.7"

    async def operator(sup: Supervisor) -> None:
        await until(lambda: bool(cluster.sent_of(Resolve)))
        sup.submit(StopJob())

    run = await run_job(tmp_path, cluster, inv, during=operator)
    assert (run.result.exit_code, run.result.status) == (130, JobState.INTERRUPTED)
    assert cluster.sent_of(Start) == [], "ranks were launched after the StopJob"


async def test_restart_group_of_the_trainer_without_checkpoints_says_it_starts_over(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, script="trainer/train.py")

    def script(attempt: int) -> Script:
        return {"r0": [LogEvery(0.0)]} if attempt == 0 else all_exit(EVERYONE, 0.03)

    cluster = make_cluster(tmp_path, script)

    async def operator(sup: Supervisor) -> None:
        await until(started_everywhere(cluster))
        sup.submit(RestartGroup())

    run = await run_job(tmp_path, cluster, inv, max_restarts=0, during=operator)
    assert run.result.exit_code == 0
    (s1,) = [s.msg for s in cluster.sent_of(Start, "a") if s.msg.attempt == 1]  # type: ignore[attr-defined]
    for p in s1.procs:  # type: ignore[attr-defined]
        assert "--resume" not in p.argv, p.argv
    (restarting,) = [e for e in run.events if isinstance(e, Restarting)]
    assert "no checkpoints" in restarting.reason and "step 0" in restarting.reason


# ------------------------------------------------------------------ the kept standby's adopt wait


async def test_attempt_0_starts_cold_once_the_adopt_wait_is_over(tmp_path: Path, clock: FakeClock) -> None:
    """A job that keeps its standby asks each node to adopt the one an earlier run kept; nodes that
    never answer (these fakes ignore Adopt) are waited for ``ADOPT_WAIT_S``, not a moment less, then
    attempt 0 starts cold."""
    inv = make_inventory(tmp_path)
    inv = dataclasses.replace(inv, restart=dataclasses.replace(inv.restart, keep_warm_s=60.0))
    assert inv.restart.keeps_warm(inv.device_target)
    cluster = make_cluster(tmp_path, all_exit(EVERYONE, 0.02))

    async def time_passes(sup: Supervisor) -> None:
        await until(lambda: len(cluster.sent_of(Adopt)) == 2)  # the wait starts now
        await clock.advance(policy_mod.ADOPT_WAIT_S - 0.01)
        assert cluster.sent_of(Start) == [], "started before the adopt wait was over"
        await clock.advance(0.01)
        await until(lambda: len(cluster.sent_of(Start)) == 2)

    run = await run_job(tmp_path, cluster, inv, during=time_passes, clock=clock)
    assert run.result.exit_code == 0, run.result.reason
    assert [s.warm for s in run.of(AttemptStarted)] == [False]
    assert [s.msg.warm for s in cluster.sent_of(Start)] == [False, False]  # type: ignore[attr-defined]
