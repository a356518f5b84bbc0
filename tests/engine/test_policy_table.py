"""The run's policy (agent/policy.py), table-driven: one table, run for both of its hosts.

The console's supervisor and a detached run's node-0 coordinator build the same ``RunPolicy``
with the settings below (``HOSTS``); each row feeds a sequence of inputs and names the actions
expected after each, the same for both hosts unless the row says otherwise (a lost node can be
reconnected only by a console; a coordinator's agents watch their own ranks' silence).

Layout: node ``a`` runs r0, r1 (and the scheduler), node ``b`` runs r2, r3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from mscon.agent import policy as P
from mscon.agent import protocol as wire

WORKERS = {"r0": "a", "r1": "a", "r2": "b", "r3": "b"}
NODES = ("a", "b")
HOSTS: dict[str, dict[str, Any]] = {
    # console/engine/supervisor.py (a live console: inf; headless: None, see the headless rows)
    "console": {"can_reconnect": True, "operator_wait_s": math.inf, "hang_timeout_s": 10.0},
    # agent/detached/run.py
    "coordinator": {"can_reconnect": False, "operator_wait_s": 900.0, "inspects": False},
}
LINGER = P.SCHEDULER_LINGER_S
CONFIRM = P.STOP_CONFIRM_S


def summary(act: P.Action) -> str:
    """An action in a few words, as the table writes it."""
    if isinstance(act, P.StartAttempt):
        return f"start {act.attempt}" + (" warm" if act.warm else "")
    if isinstance(act, P.StopAll):
        return f"stop: {act.reason}" if act.announce else "stop again"
    if isinstance(act, P.StopScheduler):
        return "stop the scheduler"
    if isinstance(act, P.Inspect):
        shown = "x its" in act.reason or "finished" in act.reason  # the derived limits say why
        return f"inspect {act.node}: {','.join(act.names)}" + (f" ({act.reason})" if shown else "")
    if isinstance(act, P.CutOff):
        return f"cut {','.join(act.nodes)}"
    if isinstance(act, P.Force):
        return "force"
    if isinstance(act, P.AttemptOver):
        return f"attempt {act.attempt} {act.outcome}"
    if isinstance(act, P.Restarting):
        return f"restart as {act.attempt} in {act.backoff_s:g} s, {act.restarts_left} left: {act.why}"
    if isinstance(act, P.AwaitOperator):
        return f"await the operator ({'as long as it stays' if act.wait_s is None else f'{act.wait_s:g} s'})"
    if isinstance(act, P.EndRun):
        v = act.verdict
        return (
            f"end {v.status}"
            + (f": {v.reason}" if v.reason else "")
            + (f" ({v.exit_code})" if v.exit_code else "")
        )
    raise AssertionError(act)


def started(t: float = 0.0) -> list[P.Input]:
    return [P.RankStarted(WORKERS[n], n, t) for n in WORKERS] + [P.RankStarted("a", "sched", t)]


def exited(name: str, t: float, code: int = 0, by_agent: bool = False, signal: str | None = None) -> P.Input:
    node = WORKERS.get(name, "a")
    detail = signal or f"exit code {code}"
    return P.RankExited(node, name, name != "sched", code == 0 and signal is None, by_agent, detail, t)


def standby(attempt: int, t: float, *nodes: str, ready: bool = True) -> list[P.Input]:
    return [P.StandbyChanged(n, attempt, ready, t) for n in nodes or NODES]


def done(t: float, *nodes: str) -> list[P.Input]:
    return [P.NodeDone(n, t) for n in nodes or NODES]


@dataclass
class Row:
    name: str
    steps: list[tuple[P.Input | list[P.Input], list[str] | dict[str, list[str]]]]
    settings: dict[str, Any] = field(default_factory=dict)  # PolicyConfig fields for this row


FAIL_R1 = "stop: r1 on a failed (exit code 7)"

TABLE = [
    Row(
        "every worker succeeds; the lingering scheduler is stopped",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            ([exited(n, 1.0) for n in WORKERS], []),
            (P.Tick(1.0 + LINGER / 2), []),
            (P.Tick(1.1 + LINGER), ["stop the scheduler"]),
            (P.Tick(1.2 + LINGER), []),  # once
            (
                [exited("sched", 7.0, signal="SIGTERM", by_agent=True), *done(7.0)],
                ["attempt 0 succeeded", "end succeeded: all ranks finished"],
            ),
        ],
    ),
    Row(
        "a failure stops every node; with budget the group restarts after the backoff",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (exited("r1", 1.0, code=7), []),  # the alarm and the message: one stop
            (exited("r0", 1.1, signal="SIGTERM", by_agent=True), []),  # a victim, not a failure
            (done(1.2), ["attempt 0 failed", "restart as 1 in 2 s, 0 left: attempt 0 failed"]),
            (P.Tick(2.0), []),
            (P.Tick(3.3), ["start 1"]),
            (started(3.5), []),
            ([exited(n, 4.0) for n in [*WORKERS, "sched"]], []),
            (done(4.1), ["attempt 1 succeeded", "end succeeded: all ranks finished (after 1 restart)"]),
        ],
        {"max_restarts": 1, "backoff_s": 2.0},
    ),
    Row(
        "every node's standby is ready: the restart is warm, and the next one cold (no standby yet)",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 1.0, "a"), []),
            (standby(1, 1.5, "b"), []),
            (exited("r1", 2.0, code=7), ["stop: r1 on a failed (exit code 7)"]),
            (done(2.2), ["attempt 0 failed", "restart as 1 in 2 s, 1 left: attempt 0 failed"]),
            (P.Tick(4.3), ["start 1 warm"]),
            (started(4.4), []),
            (exited("r1", 5.0, code=7), ["stop: r1 on a failed (exit code 7)"]),
            (done(5.2), ["attempt 1 failed", "restart as 2 in 2 s, 0 left: attempt 1 failed"]),
            (P.Tick(7.3), ["start 2"]),
        ],
        {"max_restarts": 2, "backoff_s": 2.0},
    ),
    Row(
        "one node's standby is lost, or never said ready, or is stale: the restart is cold",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 1.0), []),
            (standby(1, 1.5, "b", ready=False), []),  # a spare of b died: the standby is broken
            (exited("r1", 2.0, code=7), ["stop: r1 on a failed (exit code 7)"]),
            (done(2.2), ["attempt 0 failed", "restart as 1 in 0 s, 1 left: attempt 0 failed", "start 1"]),
            (started(2.4), []),
            (standby(1, 2.5), []),  # late word for attempt 1, which has started: no use
            (standby(2, 3.0, "a"), []),  # only a for attempt 2
            (exited("r1", 4.0, code=7), ["stop: r1 on a failed (exit code 7)"]),
            (done(4.2), ["attempt 1 failed", "restart as 2 in 0 s, 0 left: attempt 1 failed", "start 2"]),
        ],
        {"max_restarts": 2},
    ),
    Row(
        "a node lost after its standby was ready: its spares went with it, the restart is cold",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 1.0), []),
            (
                P.NodeLost("b", "connection reset", 2.0),
                {
                    "console": ["stop: lost the node b: connection reset"],
                    "coordinator": ["stop: lost the node b: connection reset"],
                },
            ),
            (
                done(2.2, "a"),
                {
                    "console": [
                        "attempt 0 failed",
                        "restart as 1 in 0 s, 0 left: attempt 0 failed",
                        "start 1",
                    ],
                    "coordinator": [
                        "attempt 0 failed",
                        "end failed: lost b: reconnecting a node needs the console (mscon attach)",
                    ],
                },
            ),
        ],
        {"max_restarts": 1},
    ),
    Row(
        "no budget left: the run waits for the operator, who restarts it (no backoff, no budget)",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (
                done(1.2),
                {
                    "console": ["attempt 0 failed", "await the operator (as long as it stays)"],
                    "coordinator": ["attempt 0 failed", "await the operator (900 s)"],
                },
            ),
            (P.Tick(500.0), []),
            (
                P.RestartRequested("r pressed", 600.0),
                [
                    "restart as 1 in 0 s, 0 left: restart requested by the operator after attempt 0 failed",
                    "start 1",
                ],
            ),
        ],
        {"backoff_s": 5.0},
    ),
    Row(
        "no budget left: the operator's stop ends the run with the failed attempt's verdict",
        [
            (P.Begin(0.0), ["start 0"]),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (
                done(1.2),
                {
                    "console": ["attempt 0 failed", "await the operator (as long as it stays)"],
                    "coordinator": ["attempt 0 failed", "await the operator (900 s)"],
                },
            ),
            (P.StopRequested("q", 130, 5.0), ["end failed"]),
        ],
    ),
    Row(
        "a waiting coordinator ends the run when nobody came",
        [
            (P.Begin(0.0), ["start 0"]),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (
                done(1.2),
                {
                    "console": ["attempt 0 failed", "await the operator (as long as it stays)"],
                    "coordinator": ["attempt 0 failed", "await the operator (900 s)"],
                },
            ),
            (P.Tick(1.2 + 899.0), []),
            (P.Tick(1.2 + 901.0), {"console": [], "coordinator": ["end failed"]}),
        ],
    ),
    Row(
        "headless: no operator to wait for, the failed run ends",
        [
            (P.Begin(0.0), ["start 0"]),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (done(1.2), ["attempt 0 failed", "end failed"]),
        ],
        {"operator_wait_s": None},
    ),
    Row(
        "a hung rank stops every node",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (P.RankHung("b", "r2", "stopped", 3.0), ["stop: r2 on b is hung (stopped)"]),
            (done(3.5), ["attempt 0 failed", "end failed"]),
        ],
        {"operator_wait_s": None},
    ),
    Row(
        "a lost node: a console reconnects it for the next attempt; a coordinator cannot",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (P.NodeLost("b", "connection reset", 2.0), ["stop: lost the node b: connection reset"]),
            (P.NodeLost("b", "connection reset", 2.0), []),
            (
                done(2.5, "a"),
                {
                    "console": [
                        "attempt 0 failed",
                        "restart as 1 in 0 s, 2 left: attempt 0 failed",
                        "start 1",
                    ],
                    "coordinator": [
                        "attempt 0 failed",
                        "end failed: lost b: reconnecting a node needs the console (mscon attach)",
                    ],
                },
            ),
        ],
        {"max_restarts": 3},
    ),
    Row(
        "an agent that cannot start its processes is a failure; an error after they started is not",
        [
            (P.Begin(0.0), ["start 0"]),
            (P.RankStarted("a", "r0", 0.1), []),
            (P.AgentFailed("a", "disk full", 0.2), []),
            (P.AgentFailed("b", "python not found", 0.3), ["stop: b: python not found"]),
        ],
    ),
    Row(
        "stop requested: every node stops; a second request forces",
        [
            (P.Begin(0.0), ["start 0"]),
            (P.StopRequested("ctrl-c", 130, 1.0), ["stop: ctrl-c"]),
            (exited("r1", 1.1, code=7), []),  # during our stop: not a new cause
            (
                P.StopRequested("ctrl-c again", 130, 1.2),
                [
                    "force",
                    "attempt 0 interrupted",
                    "end interrupted: ctrl-c (130)",
                ],
            ),
        ],
    ),
    Row(
        "stop requested, then every node confirms",
        [
            (P.Begin(0.0), ["start 0"]),
            (P.StopRequested("stop", 141, 1.0), ["stop: stop"]),
            (done(1.5), ["attempt 0 interrupted", "end interrupted: stop (141)"]),
        ],
    ),
    Row(
        "the operator's stop during a failure's stop: the run ends interrupted",
        [
            (P.Begin(0.0), ["start 0"]),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (P.StopRequested("stop", 130, 1.1), ["stop again"]),
            (done(1.5), ["attempt 0 interrupted", "end interrupted: stop (130)"]),
        ],
        {"max_restarts": 2},
    ),
    Row(
        "restart requested while running: the group restarts, the budget untouched",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (
                P.RestartRequested("r", 1.0),
                ["stop: r: the whole group restarts (a rank cannot rejoin a running collective)"],
            ),
            (done(1.5), ["attempt 0 restart requested", "restart as 1 in 2 s, 1 left: restart requested"]),
            (P.RestartRequested("r again", 1.6), ["start 1"]),  # cuts the backoff short
        ],
        {"max_restarts": 1, "backoff_s": 2.0},
    ),
    Row(
        "restart pressed while a failure stops: once stopped, the group goes again (no budget used)",
        [
            (P.Begin(0.0), ["start 0"]),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (P.RestartRequested("r", 1.1), []),
            (
                done(1.5),
                [
                    "attempt 0 failed",
                    "restart as 1 in 0 s, 0 left: restart requested by the operator after attempt 0 failed",
                    "start 1",
                ],
            ),
        ],
        {"operator_wait_s": None},
    ),
    Row(
        "stop during the backoff ends the run",
        [
            (P.Begin(0.0), ["start 0"]),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (done(1.5), ["attempt 0 failed", "restart as 1 in 9 s, 0 left: attempt 0 failed"]),
            (P.StopRequested("stop", 130, 2.0), ["end interrupted: stop (130)"]),
        ],
        {"max_restarts": 1, "backoff_s": 9.0},
    ),
    Row(
        "a node that does not confirm the stop in time is cut off",
        [
            (P.Begin(0.0), ["start 0"]),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (done(1.5, "a"), []),
            (P.Tick(1.0 + 3.0 + CONFIRM - 0.1), []),
            (
                P.Tick(1.0 + 3.0 + CONFIRM + 0.1),
                {
                    "console": [
                        "cut b",
                        "attempt 0 failed",
                        "restart as 1 in 0 s, 0 left: attempt 0 failed",
                        "start 1",
                    ],
                    "coordinator": [
                        "cut b",
                        "attempt 0 failed",
                        "end failed: lost b: reconnecting a node needs the console (mscon attach)",
                    ],
                },
            ),
        ],
        {"max_restarts": 1, "grace_s": 3.0},
    ),
    Row(
        "silent ranks are inspected once after the hang timeout (by the console; agents watch their own)",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (P.Tick(9.0), []),
            (P.Tick(10.5), {"console": ["inspect a: r0,r1", "inspect b: r2,r3"], "coordinator": []}),
            (P.Tick(30.0), []),
        ],
    ),
]


def stepped(t: float, ts: float, *names: str) -> list[P.Input]:
    """Step reports: ``ts`` on the ranks' clocks, seen by the console at ``t``."""
    return [_Stepped(n, ts, t) for n in names or tuple(WORKERS)]


@dataclass(frozen=True)
class _Stepped:
    """Not a policy input: the host calls ``RunPolicy.stepped`` for metrics (kept off ``step``)."""

    name: str
    ts: float
    now: float


DERIVED = {"hang_timeout_s": None}

TABLE += [
    Row(
        "derived limit: a silent rank in a job stepping every 50 ms is inspected within 10 s",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (stepped(1.0, 1.00), []),
            (stepped(1.05, 1.05), []),
            (stepped(1.10, 1.10, "r0", "r2", "r3"), []),  # r1 goes silent after 1.05
            (stepped(9.0, 9.0, "r0", "r2", "r3"), []),
            (P.Tick(9.0), []),  # MindSpore's teardown after a last step is ~5 s of silence: not yet
            (
                P.Tick(10.2),
                {
                    "console": [
                        "inspect a: r1 (no progress for 9 s (20 x its longest gap between steps, 0.05 s))"
                    ],
                    "coordinator": [],
                },
            ),
        ],
        DERIVED,
    ),
    Row(
        "derived limit: once a worker finished, the others may be in teardown (not hung at 10 s)",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (stepped(1.0, 1.00), []),
            (stepped(1.05, 1.05), []),
            (exited("r2", 2.0), []),
            (P.Tick(30.0), []),
            (
                P.Tick(121.2),
                {
                    "console": [
                        "inspect a: r0,r1 (no progress for 120 s (the limit once a worker has finished "
                        "(the others may be in teardown)))",
                        "inspect b: r3 (no progress for 120 s (the limit once a worker has finished "
                        "(the others may be in teardown)))",
                    ],
                    "coordinator": [],
                },
            ),
        ],
        DERIVED,
    ),
    Row(
        "derived limit: a first step that takes minutes to compile is not a hang",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (P.Tick(180.0), []),
            (P.Tick(899.0), []),
            (stepped(899.5, 899.5), []),
            (stepped(899.6, 899.6), []),
            (P.Tick(900.5), []),
        ],
        DERIVED,
    ),
    Row(
        "derived limit: no step at all for 900 s is a hang (the start-up limit)",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (P.Tick(900.5), {"console": ["inspect a: r0,r1", "inspect b: r2,r3"], "coordinator": []}),
        ],
        DERIVED,
    ),
    Row(
        "a failure after the ranks stepped restarts at once: the backoff is for start-up failures",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (stepped(0.5, 0.5), []),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (done(1.2), ["attempt 0 failed", "restart as 1 in 0 s, 2 left: attempt 0 failed", "start 1"]),
            (started(1.5), []),
            (P.RankStepped("a", "r0", 1.6), []),  # as the agents say it (any script's first metric)
            (exited("r1", 1.7, code=7), [FAIL_R1]),
            (done(1.8), ["attempt 1 failed", "restart as 2 in 0 s, 1 left: attempt 1 failed", "start 2"]),
            (started(1.5), []),
            (exited("r2", 2.0, code=7), ["stop: r2 on b failed (exit code 7)"]),
            # attempt 2 failed before any step (a start-up failure, which repeats): the backoff
            (done(2.2), ["attempt 2 failed", "restart as 3 in 2 s, 0 left: attempt 2 failed"]),
            (P.Tick(4.3), ["start 3"]),
        ],
        {"max_restarts": 3, "backoff_s": 2.0},
    ),
    Row(
        "a rank inspected but alive (its agent saw progress) is watched again",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (P.Tick(10.5), {"console": ["inspect a: r0,r1", "inspect b: r2,r3"], "coordinator": []}),
            ([P.Tick(11.0)], []),
            (stepped(12.0, 12.0, "r0"), []),
            (P.Tick(22.5), {"console": ["inspect a: r0"], "coordinator": []}),
        ],
    ),
]


def run_row(row: Row, host: str) -> None:
    cfg = P.PolicyConfig(nodes=NODES, workers=dict(WORKERS), **{**HOSTS[host], **row.settings})
    policy = P.RunPolicy(cfg)
    for i, (inputs, expected) in enumerate(row.steps):
        want = expected[host] if isinstance(expected, dict) else expected
        got = []
        for ev in inputs if isinstance(inputs, list) else [inputs]:
            if isinstance(ev, _Stepped):
                policy.stepped(ev.name, ev.ts, ev.now)
            else:
                got += [summary(a) for a in policy.step(ev)]
        assert got == want, f"{row.name!r}, {host}, step {i}"


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_policy_table(row: Row, host: str) -> None:
    run_row(row, host)


def test_progress_keeps_a_rank_from_being_inspected() -> None:
    policy = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), **HOSTS["console"]))
    policy.step(P.Begin(0.0))
    for ev in started(0.0):
        policy.step(ev)
    for name in ("r0", "r2", "r3"):
        policy.progress(name, 9.0)
    assert [summary(a) for a in policy.step(P.Tick(10.5))] == ["inspect a: r1"]


def test_ranks_silent_nearly_as_long_are_inspected_with_the_one_past_its_limit() -> None:
    """Ranks in a collective fall silent with the rank they wait for: which limit passes first on
    the console's clock is chance, and a rank not inspected before the stop has no stack to tell
    the root cause it was the one that stopped. Those within SILENT_TOGETHER_S go with it."""
    policy = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), **HOSTS["console"]))
    policy.step(P.Begin(0.0))
    for ev in started(0.0):
        policy.step(ev)
    policy.progress("r1", 0.2)  # past its 10 s at 10.5
    policy.progress("r2", 0.2 + P.SILENT_TOGETHER_S - 0.1)  # 0.1 s within it
    policy.progress("r0", 9.0)
    policy.progress("r3", 9.0)
    got = policy.step(P.Tick(10.5))
    assert [summary(a) for a in got] == ["inspect a: r1", "inspect b: r2"]
    assert got[0].reason == "no progress for 10 s (hang.timeout_s)" and got[0].silent_s == 10.0
    assert got[1].reason == "no progress for 10 s (hang.timeout_s); inspected up to 1 s early, with r1"
    assert got[1].silent_s == 10.0 - P.SILENT_TOGETHER_S  # its agent checks that much on its clock
    assert policy.step(P.Tick(10.75)) == []  # nobody is inspected twice
    # Nearly as long, but nobody past a limit yet: nobody is inspected.
    quiet = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), **HOSTS["console"]))
    quiet.step(P.Begin(0.0))
    for ev in started(0.0):
        quiet.step(ev)
    for name in WORKERS:
        quiet.progress(name, 1.0)
    assert quiet.step(P.Tick(10.5)) == []


def test_the_wire_means_the_same_to_both_hosts() -> None:
    exit_msg = wire.ProcExited("b", "r2", 2, 99, None, "SIGKILL", 9, 5, False)
    killed = P.RankExited("b", "r2", True, False, False, "killed by SIGKILL", 1.0)
    assert P.from_message("b", exit_msg, 1.0) == killed
    sched = wire.ProcExited("a", "sched", wire.SCHEDULER_RANK, 98, 0, None, None, 5, False)
    assert P.from_message("a", sched, 1.0) == P.RankExited(
        "a", "sched", False, True, False, "exit code 0", 1.0
    )
    assert P.from_message("a", wire.AllExited("a", 5), 2.0) == P.NodeDone("a", 2.0)
    assert P.from_message("a", wire.Ping(), 2.0) is None
    first = wire.RankPhase("b", "r2", 2, wire.Milestone.FIRST_STEP, 5)
    assert P.from_message("b", first, 3.0) == P.RankStepped("b", "r2", 3.0)
    assert P.from_message("b", wire.RankPhase("b", "r2", 2, wire.Milestone.JOINED, 5), 3.0) is None
    assert wire.RankPhase.reported  # a detached coordinator hears it over the link
    lost = wire.StandbyState("b", 1, False, "the spare for r2 exited (SIGKILL)")
    assert P.from_message("b", lost, 4.0) == P.StandbyChanged(
        "b", 1, False, 4.0, "the spare for r2 exited (SIGKILL)"
    )
    assert wire.StandbyState.reported


def test_standby_ports_alternate_above_the_base_and_never_meet_it() -> None:
    ports = [wire.standby_port(8118, a) for a in range(4)]
    assert ports == [8119, 8120, 8119, 8120]
    for a in range(3):  # the standby joined during attempt a is not attempt a's own port
        assert wire.standby_port(8118, a + 1) not in (8118, wire.standby_port(8118, a))
    spec = wire.ProcSpec("r0", 0, 0, ("python", "t.py"), {"MS_SCHED_PORT": "8118", "X": "1"})
    assert wire.on_standby(spec, 1).env == {"MS_SCHED_PORT": "8120", "X": "1"}
    assert spec.env["MS_SCHED_PORT"] == "8118"


def test_watchdog_and_hang_rules() -> None:
    assert P.watchdog_s(0.5) == P.WATCHDOG_FLOOR_S
    assert P.watchdog_s(10.0) == 32.0
    assert P.silent_too_long(0.0, 10.5, 10.0) and not P.silent_too_long(0.0, 9.5, 10.0)
    assert not P.silent_too_long(0.0, 1e9, 0.0)  # 0: no hang timeout


def test_nothing_after_the_end() -> None:
    policy = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), operator_wait_s=None))
    policy.step(P.Begin(0.0))
    policy.step(P.StopRequested("stop", 130, 1.0))
    assert [summary(a) for a in policy.step(P.StopRequested("again", 130, 1.1))][-1].startswith("end")
    assert policy.phase is P.Phase.ENDED
    assert policy.step(P.RestartRequested("r", 2.0)) == [] and policy.step(P.Tick(99.0)) == []


def test_a_coordinator_takes_over_the_standby_the_console_heard_of() -> None:
    """A run detached after its standby said ready restarts warm under its coordinator too."""
    console = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), max_restarts=1, **HOSTS["console"]))
    console.step(P.Begin(0.0))
    for ev in standby(1, 1.0):
        console.step(ev)
    assert console.standby_ready() == NODES
    coord = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), max_restarts=1, **HOSTS["coordinator"]))
    coord.resume(0, 2.0, console.standby_ready())
    assert [summary(a) for a in coord.step(exited("r1", 3.0, code=7))] == [FAIL_R1]
    got = [summary(a) for ev in done(3.2) for a in coord.step(ev)]
    assert got == ["attempt 0 failed", "restart as 1 in 0 s, 0 left: attempt 0 failed", "start 1 warm"]
    fresh = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), **HOSTS["coordinator"]))
    fresh.resume(0, 2.0)
    assert fresh.standby_ready() == ()
