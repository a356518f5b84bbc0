"""The run's policy (agent/policy.py), table-driven: one table, run for both of its hosts.

The console's supervisor and a detached run's node-0 coordinator build the same ``RunPolicy``
with the settings below (``HOSTS``); each row feeds a sequence of inputs and names the actions
expected after each, the same for both hosts unless the row says otherwise (a lost node can be
reconnected only by a console). Both hosts inspect silent ranks: the console hears progress in
log lines and metrics (``RunPolicy.progress``, ``stepped``), a coordinator in its agents' progress
reports (``RunPolicy.heard``, each agent's ``HangRule.pace``): ``run_row`` feeds a row's step
reports the way each host does.

Layout: node ``a`` runs r0, r1 (and the scheduler), node ``b`` runs r2, r3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from mscon.agent import policy as P
from mscon.agent import protocol as wire
from mscon.agent.liveness import REDIAL_S, Liveness

WORKERS = {"r0": "a", "r1": "a", "r2": "b", "r3": "b"}
NODES = ("a", "b")
HOSTS: dict[str, dict[str, Any]] = {
    # console/engine/supervisor.py (a live console: inf; headless: None, see the headless rows)
    "console": {"can_reconnect": True, "operator_wait_s": math.inf, "hang_timeout_s": 10.0},
    # agent/detached/run.py
    "coordinator": {"can_reconnect": False, "operator_wait_s": 900.0, "hang_timeout_s": 10.0},
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
    if isinstance(act, P.RestartRefused):
        return f"refuse the restart: {act.reason}"
    if isinstance(act, P.StopNode):
        return f"stop {act.node} again: {act.reason}"
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


def standby(
    attempt: int, t: float, *nodes: str, ready: bool = True, state: wire.StandbyPhase | None = None
) -> list[P.Input]:
    """Nodes' word on their standby for ``attempt``: ready (or lost), or ``state``."""
    return [P.StandbyChanged(n, attempt, ready if state is None else state, t) for n in nodes or NODES]


def first_steps(t: float) -> list[P.Input]:
    """Every worker's first step (its agent read its first metric)."""
    return [P.RankStepped(WORKERS[n], n, t) for n in WORKERS]


JOINING = wire.StandbyPhase.JOINING
LOST = wire.StandbyPhase.LOST


def done(t: float, *nodes: str) -> list[P.Input]:
    return [P.NodeDone(n, t) for n in nodes or NODES]


# A row's steps: each input (or inputs) and the actions it must give (per host where they differ).
Steps = list[tuple[P.Input | list[P.Input], list[str] | dict[str, list[str]]]]


@dataclass
class Row:
    name: str
    steps: Steps
    settings: dict[str, Any] = field(default_factory=dict)  # PolicyConfig fields for this row
    per_host: dict[str, dict[str, Any]] = field(default_factory=dict)  # and for one host only


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
        "restart pressed while the operator's stop or restart runs is refused, saying why",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (P.StopRequested("q", 130, 1.0), ["stop: q"]),
            (P.RestartRequested("r", 1.1), ["refuse the restart: the run is stopping"]),
            (done(1.5), ["attempt 0 interrupted", "end interrupted: q (130)"]),
        ],
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
        "silent ranks are inspected once after the hang timeout",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (P.Tick(9.0), []),
            (P.Tick(10.5), ["inspect a: r0,r1", "inspect b: r2,r3"]),
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
                ["inspect a: r1 (no progress for 9 s (20 x its longest gap between steps, 0.05 s))"],
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
                [
                    "inspect a: r0,r1 (no progress for 120 s (the limit once a worker has finished "
                    "(the others may be in teardown)))",
                    "inspect b: r3 (no progress for 120 s (the limit once a worker has finished "
                    "(the others may be in teardown)))",
                ],
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
            (P.Tick(900.5), ["inspect a: r0,r1", "inspect b: r2,r3"]),
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
            (P.Tick(10.5), ["inspect a: r0,r1", "inspect b: r2,r3"]),
            ([P.Tick(11.0)], []),
            (stepped(12.0, 12.0, "r0"), []),
            (P.Tick(22.5), ["inspect a: r0"]),
        ],
    ),
]


# A coordinator hears its followers over their links (agent/detached/run.py); a console's links
# have keepalives of their own, and a link it loses is a NodeLost (the rows above).
WATCHES_B = {"coordinator": {"watched": ("b",), "watchdog_s": 5.0}}
LOST_B = "lost b: reconnecting a node needs the console (mscon attach)"

TABLE += [
    Row(
        "liveness: a follower not heard from for the watchdog period is cut off and lost",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (P.Heard("b", 2.0), []),
            (P.Tick(6.9), []),  # 4.9 s since its last word
            (
                P.Tick(7.1),
                {"console": [], "coordinator": ["cut b", "stop: lost the node b: no word for 5s"]},
            ),
            (P.Tick(7.2), []),  # once
            (done(8.0, "a"), {"console": [], "coordinator": ["attempt 0 failed", f"end failed: {LOST_B}"]}),
        ],
        per_host=WATCHES_B,
    ),
    Row(
        "liveness: a follower whose link ended is not lost while it dials in again within the watchdog",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (P.LinkLost("b", 1.0), []),
            (P.Tick(4.0), []),
            (P.Heard("b", 4.5), []),  # back (a running attempt: nothing to catch up on)
            (P.Tick(9.0), []),
            (P.LinkLost("b", 9.2), []),
            (P.Tick(9.4), []),  # 4.9 s since its last word
            (
                P.Tick(9.6),
                {
                    "console": [],
                    "coordinator": [
                        "cut b",
                        "stop: lost the node b: its link ended and was not back within 5s",
                    ],
                },
            ),
        ],
        per_host=WATCHES_B,
    ),
    Row(
        "liveness: a follower whose link was down as the stop went out is told to stop again",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(0.0), []),
            (P.LinkLost("b", 0.9), []),
            (exited("r1", 1.0, code=7), [FAIL_R1]),
            (
                P.Heard("b", 1.5),
                {"console": [], "coordinator": ["stop b again: r1 on a failed (exit code 7)"]},
            ),
            (P.Heard("b", 1.6), []),  # once
            (done(2.0), ["attempt 0 failed", "end failed"]),
        ],
        {"operator_wait_s": None},
        WATCHES_B,
    ),
]


def cold_then_warm(standby_1: Steps) -> Steps:
    """Attempt 0 cold (10 s to every worker's first step; ``standby_1``: its spares' words), a
    fault, attempt 1 warm (3 s: a wait for a standby is worth 10 - 3 = 7 s at most), then attempt
    2's standby joining at 15.5."""
    return [
        (P.Begin(0.0), ["start 0"]),
        (started(), []),
        *standby_1,
        (first_steps(10.0), []),
        (exited("r1", 12.0, code=7), [FAIL_R1]),
        (done(12.0), ["attempt 0 failed", "restart as 1 in 0 s, 2 left: attempt 0 failed", "start 1 warm"]),
        (started(12.1), []),
        (first_steps(15.0), []),
        (standby(2, 15.5, state=JOINING), []),
    ]


JOINED_IN_8_5 = [(standby(1, 0.5, state=JOINING), []), (standby(1, 9.0), [])]  # this run's standby: 8.5 s


ADOPT = P.ADOPT_WAIT_S
ASKED = P.AwaitAdoption(NODES, 0.0)  # the console asked both nodes to adopt their kept standby

# A fault soon after a warm restart (issue 43): that attempt's spares start at its first step and
# are still joining when the fault comes; once its ranks are stopped they join fast.
TABLE += [
    Row(
        "a restart due while every node's standby is still joining waits for it, then starts warm",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 0.5, state=JOINING), []),
            (first_steps(10.0), []),
            (standby(1, 11.0, "a"), []),
            (exited("r1", 12.0, code=7), [FAIL_R1]),
            (done(12.2), ["attempt 0 failed", "restart as 1 in 0 s, 1 left: attempt 0 failed"]),
            (P.Tick(15.0), []),  # b's spares still joining: worth the wait
            (standby(1, 16.0, "b"), ["start 1 warm"]),
        ],
        {"max_restarts": 2},
    ),
    Row(
        "the wait for a joining standby lasts at most the cold start-up over the warm one, as measured",
        [
            *cold_then_warm([(standby(1, 0.5), [])]),
            (exited("r1", 16.0, code=7), [FAIL_R1]),
            (done(16.0), ["attempt 1 failed", "restart as 2 in 0 s, 1 left: attempt 1 failed"]),
            (P.Tick(22.9), []),  # 10 - 3 = 7 s: waiting longer could not beat a cold start
            (P.Tick(23.1), ["start 2"]),
            (standby(2, 23.5), []),  # too late
        ],
        {"max_restarts": 3},
    ),
    Row(
        "a joining standby not expected ready before the wait stops paying is not waited for: cold at once",
        [
            *cold_then_warm(JOINED_IN_8_5),  # attempt 2's standby expected ready at 15.5 + 8.5 = 24.0
            (exited("r1", 16.0, code=7), [FAIL_R1]),
            (
                done(16.0),  # 24.0 is past 16 + 7: no better than a cold start now
                ["attempt 1 failed", "restart as 2 in 0 s, 1 left: attempt 1 failed", "start 2"],
            ),
        ],
        {"max_restarts": 3},
    ),
    Row(
        "a joining standby expected ready in time is waited for: the same fault later, warm",
        [
            *cold_then_warm(JOINED_IN_8_5),  # attempt 2's standby expected ready at 15.5 + 8.5 = 24.0
            (exited("r1", 20.0, code=7), [FAIL_R1]),
            (done(20.0), ["attempt 1 failed", "restart as 2 in 0 s, 1 left: attempt 1 failed"]),
            (standby(2, 23.0), ["start 2 warm"]),  # expected by 24.0, within 20 + 7
        ],
        {"max_restarts": 3},
    ),
    Row(
        "a standby not yet timed against a cold start is waited for STANDBY_WAIT_S, then cold",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 0.5, state=JOINING), []),
            (exited("r1", 2.0, code=7), [FAIL_R1]),  # before every worker's first step
            (done(2.0), ["attempt 0 failed", "restart as 1 in 0 s, 0 left: attempt 0 failed"]),
            (P.Tick(2.0 + P.STANDBY_WAIT_S - 0.1), []),
            (P.Tick(2.0 + P.STANDBY_WAIT_S + 0.1), ["start 1"]),
        ],
        {"max_restarts": 1},
    ),
    Row(
        "a joining standby that loses a spare while a restart waits for it: cold at once",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 0.5, state=JOINING), []),
            (exited("r1", 2.0, code=7), [FAIL_R1]),
            (done(2.2), ["attempt 0 failed", "restart as 1 in 0 s, 0 left: attempt 0 failed"]),
            (standby(1, 3.0, "b", state=LOST), ["start 1"]),
        ],
        {"max_restarts": 1},
    ),
    Row(
        "no wait unless every node's standby is joining or ready: one node silent, the restart is cold",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 0.5, "a", state=JOINING), []),
            (exited("r1", 2.0, code=7), [FAIL_R1]),
            (done(2.2), ["attempt 0 failed", "restart as 1 in 0 s, 0 left: attempt 0 failed", "start 1"]),
        ],
        {"max_restarts": 1},
    ),
    Row(
        "a node lost while a restart waits for its joining standby: cold at once",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 0.5, state=JOINING), []),
            (exited("r1", 2.0, code=7), [FAIL_R1]),
            (done(2.2), ["attempt 0 failed", "restart as 1 in 0 s, 0 left: attempt 0 failed"]),
            (P.NodeLost("b", "connection reset", 3.0), []),  # its spares went with it
            (P.Tick(3.1), ["start 1"]),
        ],
        {"max_restarts": 1},
    ),
    Row(
        "a backoff counts towards the wait: a standby joining past it is not waited for longer",
        [
            (P.Begin(0.0), ["start 0"]),
            (started(), []),
            (standby(1, 0.5, state=JOINING), []),
            (first_steps(10.0), []),
            (
                P.RestartRequested("r", 12.0),
                ["stop: r: the whole group restarts (a rank cannot rejoin a running collective)"],
            ),
            (done(12.0), ["attempt 0 restart requested", "restart as 1 in 20 s, 1 left: restart requested"]),
            (P.Tick(31.9), []),
            (P.Tick(32.1), ["start 1"]),  # 20 s of backoff is more than the 10 s the wait is worth
        ],
        {"max_restarts": 1, "backoff_s": 20.0},
    ),
]

TABLE += [
    Row(
        "adopt wait: a kept standby still joining is waited for, then attempt 0 starts warm",
        [
            (ASKED, []),
            (P.Begin(0.0), []),
            (standby(0, 0.5, "a", state=JOINING), []),
            (standby(0, 1.0, "b"), []),
            (standby(0, 2.0, "a"), ["start 0 warm"]),
        ],
    ),
    Row(
        "adopt wait: attempt 0 starts warm once every node adopted the standby it kept",
        [
            (ASKED, []),
            (P.Begin(0.0), []),
            (standby(0, 1.0, "a"), []),
            (P.Tick(2.0), []),
            (standby(0, 2.5, "b"), ["start 0 warm"]),
        ],
    ),
    Row(
        "adopt wait: all or nothing, a node whose kept standby does not fit starts it cold at once",
        [
            (ASKED, []),
            (P.Begin(0.0), []),
            (standby(0, 1.0, "a"), []),
            (standby(0, 1.5, "b", ready=False), ["start 0"]),
            (standby(0, 1.6, "b"), []),  # late: attempt 0 has started
        ],
    ),
    Row(
        "adopt wait: a node that never answers is waited for ADOPT_WAIT_S, not a moment less, then cold",
        [
            (ASKED, []),
            (P.Begin(0.0), []),
            (standby(0, 1.0, "a"), []),
            (P.Tick(ADOPT - 0.01), []),
            (P.Tick(ADOPT), ["start 0"]),
        ],
    ),
    Row(
        "adopt wait: a node lost while it is waited for starts attempt 0 cold",
        [
            (ASKED, []),
            (P.Begin(0.0), []),
            (standby(0, 1.0, "a"), []),
            (P.NodeLost("b", "connection reset", 2.0), ["start 0"]),
        ],
    ),
    Row(
        "adopt wait: a stop while the nodes answer ends the run before anything starts",
        [
            (ASKED, []),
            (P.Begin(0.0), []),
            (P.StopRequested("q", 130, 1.0), ["end interrupted: q (130)"]),
            (standby(0, 1.5), []),
        ],
    ),
]


def run_row(row: Row, host: str) -> None:
    settings = {**HOSTS[host], **row.settings, **row.per_host.get(host, {})}
    cfg = P.PolicyConfig(nodes=NODES, workers=dict(WORKERS), **settings)
    policy = P.RunPolicy(cfg)
    agents = P.HangRule()  # a coordinator's agents' record of their ranks' steps (agent/ranks.py)
    for i, (inputs, expected) in enumerate(row.steps):
        want = expected[host] if isinstance(expected, dict) else expected
        got = []
        for ev in inputs if isinstance(inputs, list) else [inputs]:
            if isinstance(ev, _Stepped) and host == "console":
                ev = P.StepReport(ev.name, ev.ts, ev.now)  # each metric it reads
            elif isinstance(ev, _Stepped):  # the agent reads it, the coordinator hears its report
                agents.stepped(ev.name, ev.ts)
                ev = P.ProgressReport(ev.name, ev.now, agents.pace(ev.name))
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
        policy.step(P.RankProgress(name, 9.0))
    assert [summary(a) for a in policy.step(P.Tick(10.5))] == ["inspect a: r1"]


def test_ranks_silent_nearly_as_long_are_inspected_with_the_one_past_its_limit() -> None:
    """Ranks in a collective fall silent with the rank they wait for: which limit passes first on
    the console's clock is chance, and a rank not inspected before the stop has no stack to tell
    the root cause it was the one that stopped. Those within SILENT_TOGETHER_S go with it."""
    policy = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), **HOSTS["console"]))
    policy.step(P.Begin(0.0))
    for ev in started(0.0):
        policy.step(ev)
    policy.step(P.RankProgress("r1", 0.2))  # past its 10 s at 10.5
    policy.step(P.RankProgress("r2", 0.2 + P.SILENT_TOGETHER_S - 0.1))  # 0.1 s within it
    policy.step(P.RankProgress("r0", 9.0))
    policy.step(P.RankProgress("r3", 9.0))
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
        quiet.step(P.RankProgress(name, 1.0))
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


def test_a_standbys_state_is_one_of_three_words_on_the_wire() -> None:
    joining = wire.StandbyState("b", 2, wire.StandbyPhase.JOINING)
    line = wire.encode(joining)
    assert '"state":"joining"' in line
    back = wire.decode(line)
    assert back == joining and back.state is wire.StandbyPhase.JOINING  # type: ignore[attr-defined]
    assert (back.joining, back.ready) == (True, False)  # type: ignore[attr-defined]
    assert P.from_message("b", back, 5.0) == P.StandbyChanged("b", 2, wire.StandbyPhase.JOINING, 5.0)
    assert wire.decode(line.replace("joining", "ready")).ready  # type: ignore[attr-defined]
    with pytest.raises(wire.ProtocolError, match="state 'almost' is none of joining, ready, lost"):
        wire.decode(line.replace("joining", "almost"))


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
    assert policy.phase is P.RunPhase.ENDED
    assert policy.step(P.RestartRequested("r", 2.0)) == [] and policy.step(P.Tick(99.0)) == []


def test_a_coordinator_takes_over_the_standby_the_console_heard_of() -> None:
    """A run detached after its standby said ready restarts warm under its coordinator too."""
    console = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), max_restarts=1, **HOSTS["console"]))
    console.step(P.Begin(0.0))
    for ev in standby(1, 1.0):
        console.step(ev)
    assert console.standby_ready() == NODES
    coord = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), max_restarts=1, **HOSTS["coordinator"]))
    coord.step(P.Resume(0, 2.0, console.standby_ready()))
    assert [summary(a) for a in coord.step(exited("r1", 3.0, code=7))] == [FAIL_R1]
    got = [summary(a) for ev in done(3.2) for a in coord.step(ev)]
    assert got == ["attempt 0 failed", "restart as 1 in 0 s, 0 left: attempt 0 failed", "start 1 warm"]
    fresh = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), **HOSTS["coordinator"]))
    fresh.step(P.Resume(0, 2.0))
    assert fresh.standby_ready() == ()


# ------------------------------------------------------------------ a link's two ends (liveness.py)

# A follower watches its coordinator and dials it again; a coordinator watches its followers (its
# RunPolicy holds one, the rows above) and never dials.
ENDS = {"follower": True, "coordinator": False}
LIVENESS = [
    (
        "a link that ends is dialled again at once, then every REDIAL_S, until word comes",
        [
            (P.LinkLost("c", 1.0), {"follower": ["redial c"], "coordinator": []}),
            (P.LinkLost("c", 1.1), []),  # the same outage
            (P.Tick(1.0 + REDIAL_S / 2), []),
            (P.Tick(1.0 + REDIAL_S), {"follower": ["redial c"], "coordinator": []}),
            (P.Heard("c", 1.7), []),
            (P.Tick(3.0), []),  # back: no more dialling
            (P.Tick(6.6), []),
            (P.Tick(6.8), ["lost c: no word for 5s"]),
            (P.Tick(9.0), []),  # once
            (P.Heard("c", 9.1), []),  # too late: lost is lost
            (P.LinkLost("c", 9.2), []),
        ],
    ),
    (
        "a peer never heard from is lost a watchdog period after the watch began",
        [(P.Tick(4.9), []), (P.Tick(5.1), ["lost c: no word for 5s"])],
    ),
    (
        "a link that ended and never came back is lost, saying so",
        [
            (P.Heard("c", 1.0), []),
            (P.LinkLost("c", 2.0), {"follower": ["redial c"], "coordinator": []}),
            (
                P.Tick(6.1),
                {
                    "follower": ["lost c: its link ended and was not back within 5s"],
                    "coordinator": ["lost c: its link ended and was not back within 5s"],
                },
            ),
        ],
    ),
]


@pytest.mark.parametrize("end", sorted(ENDS))
@pytest.mark.parametrize("row", LIVENESS, ids=[name for name, _ in LIVENESS])
def test_liveness_table(row: tuple, end: str) -> None:
    name, steps = row
    watch = Liveness(("c",), 5.0, 0.0, redials=ENDS[end])
    for i, (ev, expected) in enumerate(steps):
        want = expected[end] if isinstance(expected, dict) else expected
        got = []
        for act in watch.step(ev):
            if isinstance(act, P.Redial):
                got.append(f"redial {act.node}")
            elif isinstance(act, P.PeerLost):
                got.append(f"lost {act.node}: {act.why}")
        assert got == want, f"{name!r}, {end}, step {i}"


def test_a_coordinator_hears_progress_and_pace_as_its_agents_read_them() -> None:
    """``ProgressReport``: a report that took longer on its way never moves a rank's last progress back (nor
    makes an inspected rank look alive), and the pace merges the agent's record of every step."""
    policy = P.RunPolicy(P.PolicyConfig(NODES, dict(WORKERS), **{**HOSTS["coordinator"], **DERIVED}))
    policy.step(P.Begin(0.0))
    for ev in started(0.0):
        policy.step(ev)
    agent = P.HangRule()
    for ts in (1.0, 1.05, 1.10):
        agent.stepped("r1", ts)
    assert agent.pace("r1") == (1.10, pytest.approx(0.05)) and agent.pace("r0") is None
    for name in WORKERS:
        policy.step(P.ProgressReport(name, 9.0, agent.pace("r1") if name == "r1" else (9.0, 0.05)))
    policy.step(P.ProgressReport("r1", 1.10, None))  # an older word, arriving late: ignored
    got = policy.step(P.Tick(10.2))
    assert [summary(a) for a in got] == []  # r1 silent since 9.0, not 1.1: not yet at its 9 s
    assert [summary(a) for a in policy.step(P.Tick(18.2))] == [
        "inspect a: r0,r1 (no progress for 9 s (20 x its longest gap between steps, 0.05 s))",
        "inspect b: r2,r3 (no progress for 9 s (20 x its longest gap between steps, 0.05 s))",
    ]
    policy.step(P.ProgressReport("r1", 8.9, None))  # still no newer progress: inspected, not watched again
    assert policy.step(P.Tick(30.0)) == []
