"""Every row of the run's policy table (``policy.TABLE``: (RunPhase, input type) -> handler), on
both of its hosts.

A handled row has its case in ``CASES`` (a row added to the table without one fails
``test_every_row_has_a_case``); a row the phase ignores is checked to change nothing; a refused row
to raise. The console's supervisor and a detached run's coordinator drive the same class with
their own settings (``HOSTS``): every case runs for both.

Layout: node ``a`` runs r0, r1, node ``b`` runs r2, r3; hang limit 10 s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from mscon.agent import policy as P
from mscon.agent.detached import run as detached_run
from mscon.console.engine import supervisor

R = P.RunPhase
WORKERS = {"r0": "a", "r1": "a", "r2": "b", "r3": "b"}
NODES = ("a", "b")
HOSTS: dict[str, dict[str, Any]] = {
    "console": {"can_reconnect": True, "operator_wait_s": math.inf},
    # a coordinator watches its follower b over its link (watchdog 20 s)
    "coordinator": {"can_reconnect": False, "operator_wait_s": 900.0, "watched": ("b",), "watchdog_s": 20.0},
}
FAILED_R1 = P.RankExited("a", "r1", True, False, False, "exit code 7", 1.0)

# Where each phase's rows start from: the inputs that bring a fresh policy there.
BASES: dict[str, list[P.Input]] = {
    "idle": [],
    "begun": [P.Begin(0.0)],
    "running": [P.Begin(0.0)] + [P.RankStarted(n, r, 0.0) for r, n in WORKERS.items()],
}
BASES["stopping"] = BASES["running"] + [FAILED_R1]
BASES["backoff"] = BASES["stopping"] + [P.NodeDone("a", 1.1), P.NodeDone("b", 1.2)]  # restart at 3.2
BASES["awaiting"] = BASES["backoff"]  # with no restart left
BASES["ended"] = [P.StopRequested("q", 130, 0.0)]
BASE_OF = {
    R.IDLE: "idle",
    R.RUNNING: "running",
    R.STOPPING: "stopping",
    R.BACKOFF: "backoff",
    R.AWAITING_OPERATOR: "awaiting",
    R.ENDED: "ended",
}
# One input of each type, for the rows that ignore it.
SAMPLES: dict[type, P.Input] = {
    P.AwaitAdoption: P.AwaitAdoption(("a",), 1.5),
    P.Begin: P.Begin(1.5),
    P.RankStarted: P.RankStarted("a", "r0", 1.5),
    P.RankExited: P.RankExited("a", "r0", True, False, False, "exit code 1", 1.5),
    P.RankStepped: P.RankStepped("a", "r0", 1.5),
    P.RankHung: P.RankHung("a", "r0", "stopped", 1.5),
    P.AgentFailed: P.AgentFailed("a", "cannot start", 1.5),
    P.NodeDone: P.NodeDone("a", 1.5),
    P.NodeLost: P.NodeLost("a", "reset", 1.5),
    P.StopRequested: P.StopRequested("q", 130, 1.5),
    P.RestartRequested: P.RestartRequested("r", 1.5),
    P.StandbyChanged: P.StandbyChanged("a", 9, True, 1.5),
    P.Heard: P.Heard("b", 1.5),
    P.LinkLost: P.LinkLost("b", 1.5),
    P.Tick: P.Tick(1.5),
    P.Resume: P.Resume(0, 1.5),
    P.RankProgress: P.RankProgress("r0", 1.5),
    P.StepReport: P.StepReport("r0", 1.5, 1.5),
    P.ProgressReport: P.ProgressReport("r0", 1.5, (1.5, 0.1)),
}

Check = Callable[[P.RunPolicy, str, list], Any]


@dataclass
class Case:
    ev: P.Input
    want: list[str] | dict[str, list[str]]  # the actions' type names (per host when they differ)
    phase: R | dict[str, R]  # the phase after
    check: Check | None = None  # what a row with no action changed
    base: str = ""  # default: the phase's own (BASE_OF)
    before: list[P.Input] = field(default_factory=list)


def policy_for(host: str, base: str) -> P.RunPolicy:
    cfg = P.PolicyConfig(
        NODES, dict(WORKERS), max_restarts=1, backoff_s=2.0, hang_timeout_s=10.0, **HOSTS[host]
    )
    policy = P.RunPolicy(cfg, restarts_left=0 if base == "awaiting" else None)
    for ev in BASES[base]:
        policy.step(ev)
    return policy


def inspected(acts: list) -> list[str]:
    return sorted(n for a in acts if isinstance(a, P.Inspect) for n in a.names)


def watched_down(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.liveness.is_down("b") is (host == "coordinator")


def watched_heard(p: P.RunPolicy, host: str, acts: list) -> None:
    if host == "coordinator":
        assert p.liveness.heard["b"] == 1.6
    else:
        assert "b" not in p.liveness.heard  # a console's links keep their own keepalives


def standby_kept(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.standby == {"a": P.StandbyPhase.READY} and p.standby_for == p.attempt + 1


def progress_r0(at: float) -> Check:
    def check(p: P.RunPolicy, host: str, acts: list) -> None:
        assert p.att.progress["r0"] == at

    return check


def _quiet_but_r1(p: P.RunPolicy, host: str, acts: list) -> None:
    assert inspected(p.step(P.Tick(10.5))) == ["r0", "r2", "r3"]  # r1 spoke at 9.0


def _paced(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.att.stepped and p.att.hang.pace("r0") == (5.0, None)


def _merged(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.att.progress["r0"] == 9.0 and p.att.hang.pace("r0") == (5.0, 0.5) and p.att.stepped


def _stepped(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.att.stepped and p.att.progress["r0"] == 1.5


def _done_a(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.done_nodes == {"a"}


def _not_live(p: P.RunPolicy, host: str, acts: list) -> None:
    assert "r0" not in p.att.live and not p.att.ok_workers


def _cause(cause: P.StopCause) -> Check:
    def check(p: P.RunPolicy, host: str, acts: list) -> None:
        assert p.att.stop_cause is cause

    return check


def _waits(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.step(P.Begin(0.1)) == []  # a's word is awaited


def _resumed(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.attempt == 3 and p.standby_ready() == NODES


def _restart_after(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.att.restart_after


def _standby_dropped(p: P.RunPolicy, host: str, acts: list) -> None:
    assert "b" not in p.standby and p.standby == {"a": P.StandbyPhase.READY}


def _attempt_1(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.attempt == 1


def _warm_1(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.attempt == 1 and acts == [P.StartAttempt(1, warm=True)]


def _first_stop_stands(p: P.RunPolicy, host: str, acts: list) -> None:
    assert p.att.stop_reason.startswith("r1 on a failed")


SHARED = {
    P.Heard: lambda: Case(P.Heard("b", 1.6), [], None, watched_heard),  # type: ignore[arg-type]
    P.LinkLost: lambda: Case(P.LinkLost("b", 1.6), [], None, watched_down),  # type: ignore[arg-type]
    P.StandbyChanged: lambda: Case(P.StandbyChanged("a", 1, True, 1.6), [], None, standby_kept),  # type: ignore[arg-type]
}


def _attempt_rows(phase: R) -> dict[tuple[R, type], Case]:
    """The rows RUNNING and STOPPING share (what an attempt's ranks and nodes say)."""
    return {
        (phase, P.RankStarted): Case(P.RankStarted("a", "r0", 1.5), [], phase, progress_r0(1.5)),
        (phase, P.RankStepped): Case(P.RankStepped("a", "r0", 1.5), [], phase, _stepped),
        (phase, P.StepReport): Case(P.StepReport("r0", 5.0, 1.5), [], phase, _paced),
        (phase, P.ProgressReport): Case(P.ProgressReport("r0", 9.0, (5.0, 0.5)), [], phase, _merged),
    }


CASES: dict[tuple[R, type], Case] = {
    # ------------------------------------------------------------ IDLE
    (R.IDLE, P.AwaitAdoption): Case(P.AwaitAdoption(("a",), 0.0), [], R.IDLE, _waits),
    (R.IDLE, P.Begin): Case(P.Begin(0.0), ["StartAttempt"], R.RUNNING),
    (R.IDLE, P.Resume): Case(P.Resume(3, 0.0, NODES), [], R.RUNNING, _resumed),
    (R.IDLE, P.StandbyChanged): Case(
        P.StandbyChanged("a", 0, True, 0.5),
        ["StartAttempt"],
        R.RUNNING,
        before=[P.AwaitAdoption(("a",), 0.0), P.Begin(0.0)],
    ),
    (R.IDLE, P.NodeLost): Case(
        P.NodeLost("b", "reset", 0.5),
        ["StartAttempt"],
        R.RUNNING,
        before=[P.AwaitAdoption(NODES, 0.0), P.Begin(0.0)],
    ),
    (R.IDLE, P.StopRequested): Case(P.StopRequested("q", 130, 0.0), ["EndRun"], R.ENDED),
    (R.IDLE, P.Tick): Case(  # the adoption wait is over (and the coordinator's follower silent)
        P.Tick(P.ADOPT_WAIT_S + 0.1),
        {"console": ["StartAttempt"], "coordinator": ["CutOff", "StartAttempt"]},
        R.RUNNING,
        before=[P.AwaitAdoption(("a",), 0.0), P.Begin(0.0)],
    ),
    # ------------------------------------------------------------ RUNNING
    **_attempt_rows(R.RUNNING),
    (R.RUNNING, P.RankExited): Case(FAILED_R1, ["StopAll"], R.STOPPING, _cause(P.StopCause.FAILURE)),
    (R.RUNNING, P.RankHung): Case(P.RankHung("a", "r1", "stopped", 1.0), ["StopAll"], R.STOPPING),
    (R.RUNNING, P.AgentFailed): Case(
        P.AgentFailed("b", "no python", 0.5), ["StopAll"], R.STOPPING, base="begun"
    ),
    (R.RUNNING, P.NodeDone): Case(P.NodeDone("a", 1.5), [], R.RUNNING, _done_a),
    (R.RUNNING, P.RankProgress): Case(P.RankProgress("r1", 9.0), [], R.RUNNING, _quiet_but_r1),
    (R.RUNNING, P.NodeLost): Case(P.NodeLost("b", "reset", 0.5), ["StopAll"], R.STOPPING),
    (R.RUNNING, P.StopRequested): Case(
        P.StopRequested("q", 130, 0.5), ["StopAll"], R.STOPPING, _cause(P.StopCause.OPERATOR)
    ),
    (R.RUNNING, P.RestartRequested): Case(
        P.RestartRequested("r", 0.5), ["StopAll"], R.STOPPING, _cause(P.StopCause.RESTART)
    ),
    (R.RUNNING, P.Tick): Case(P.Tick(10.5), ["Inspect", "Inspect"], R.RUNNING),
    # ------------------------------------------------------------ STOPPING (r1 failed at 1.0)
    **_attempt_rows(R.STOPPING),
    (R.STOPPING, P.RankExited): Case(
        P.RankExited("a", "r0", True, False, True, "SIGTERM", 1.5), [], R.STOPPING, _not_live
    ),
    (R.STOPPING, P.RankHung): Case(P.RankHung("b", "r2", "stopped", 1.5), [], R.STOPPING, _first_stop_stands),
    (R.STOPPING, P.AgentFailed): Case(P.AgentFailed("b", "oops", 1.5), [], R.STOPPING, _first_stop_stands),
    (R.STOPPING, P.NodeDone): Case(
        P.NodeDone("b", 1.6), ["AttemptOver", "Restarting"], R.BACKOFF, before=[P.NodeDone("a", 1.5)]
    ),
    (R.STOPPING, P.RankProgress): Case(P.RankProgress("r0", 1.5), [], R.STOPPING, progress_r0(1.5)),
    (R.STOPPING, P.NodeLost): Case(
        P.NodeLost("b", "reset", 1.6),
        {"console": ["AttemptOver", "Restarting"], "coordinator": ["AttemptOver", "EndRun"]},
        {"console": R.BACKOFF, "coordinator": R.ENDED},
        before=[P.NodeDone("a", 1.5)],
    ),
    (R.STOPPING, P.StopRequested): Case(
        P.StopRequested("q", 130, 1.5), ["StopAll"], R.STOPPING, _cause(P.StopCause.OPERATOR)
    ),
    (R.STOPPING, P.RestartRequested): Case(P.RestartRequested("r", 1.5), [], R.STOPPING, _restart_after),
    (R.STOPPING, P.Tick): Case(  # nobody confirmed the stop within grace + STOP_CONFIRM_S
        P.Tick(1.0 + P.DEFAULT_GRACE_S + P.STOP_CONFIRM_S + 0.1),
        {
            "console": ["CutOff", "AttemptOver", "Restarting"],
            "coordinator": ["CutOff", "AttemptOver", "EndRun"],
        },
        {"console": R.BACKOFF, "coordinator": R.ENDED},
    ),
    (R.STOPPING, P.Heard): Case(  # back after its link ended: the stop it may have missed, again
        P.Heard("b", 1.6),
        {"console": [], "coordinator": ["StopNode"]},
        R.STOPPING,
        before=[P.LinkLost("b", 1.5)],
    ),
    # ------------------------------------------------------------ BACKOFF (attempt 1 at 3.2)
    (R.BACKOFF, P.NodeLost): Case(
        P.NodeLost("b", "reset", 1.5),
        [],
        R.BACKOFF,
        _standby_dropped,
        before=[P.StandbyChanged("a", 1, True, 1.3), P.StandbyChanged("b", 1, True, 1.3)],
    ),
    (R.BACKOFF, P.StopRequested): Case(P.StopRequested("q", 130, 1.5), ["EndRun"], R.ENDED),
    (R.BACKOFF, P.RestartRequested): Case(
        P.RestartRequested("r", 1.5), ["StartAttempt"], R.RUNNING, _attempt_1
    ),
    (R.BACKOFF, P.Tick): Case(P.Tick(3.3), ["StartAttempt"], R.RUNNING, _attempt_1),
    (R.BACKOFF, P.StandbyChanged): Case(  # the restart due at 3.2 waits for b's joining standby
        P.StandbyChanged("b", 1, P.StandbyPhase.READY, 3.5),
        ["StartAttempt"],
        R.RUNNING,
        _warm_1,
        before=[
            P.StandbyChanged("a", 1, P.StandbyPhase.READY, 1.3),
            P.StandbyChanged("b", 1, P.StandbyPhase.JOINING, 1.3),
            P.Tick(3.3),
        ],
    ),
    # ------------------------------------------------------------ AWAITING_OPERATOR (attempt 0 failed)
    (R.AWAITING_OPERATOR, P.NodeLost): Case(
        P.NodeLost("a", "reset", 1.5),
        {"console": [], "coordinator": ["EndRun"]},
        {"console": R.AWAITING_OPERATOR, "coordinator": R.ENDED},
    ),
    (R.AWAITING_OPERATOR, P.StopRequested): Case(P.StopRequested("q", 130, 1.5), ["EndRun"], R.ENDED),
    (R.AWAITING_OPERATOR, P.RestartRequested): Case(
        P.RestartRequested("r", 1.5), ["Restarting", "StartAttempt"], R.RUNNING, _attempt_1
    ),
    (R.AWAITING_OPERATOR, P.Tick): Case(  # the console waits while it stays; the coordinator 900 s
        P.Tick(1.2 + 900.1),
        {"console": [], "coordinator": ["CutOff", "EndRun"]},
        {"console": R.AWAITING_OPERATOR, "coordinator": R.ENDED},
    ),
}
for _phase in (R.IDLE, R.RUNNING, R.STOPPING, R.BACKOFF, R.AWAITING_OPERATOR):
    for _kind, _make in SHARED.items():
        if (_phase, _kind) not in CASES:
            _case = _make()
            _case.phase = _phase
            CASES[(_phase, _kind)] = _case


def _row_id(row: tuple[R, type]) -> str:
    return f"{row[0].name}-{row[1].__name__}"


def _rows(kind: Callable) -> list[tuple[R, type]]:
    return sorted((r for r, h in P.TABLE.items() if kind(h)), key=_row_id)


HANDLED = _rows(lambda h: h not in (P.RunPolicy._ignore, P.RunPolicy._refuse))
IGNORED = _rows(lambda h: h is P.RunPolicy._ignore)
REFUSED = _rows(lambda h: h is P.RunPolicy._refuse)


def test_every_row_has_a_case() -> None:
    """The table covers every (phase, input) pair, and every handled row has its case here."""
    assert set(P.TABLE) == {(phase, kind) for phase in R for kind in P.INPUTS}
    assert set(SAMPLES) == set(P.INPUTS)
    assert sorted(CASES, key=_row_id) == HANDLED


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("row", HANDLED, ids=_row_id)
def test_handled_row(row: tuple[R, type], host: str) -> None:
    phase, kind = row
    case = CASES[row]
    policy = policy_for(host, case.base or BASE_OF[phase])
    for ev in case.before:
        policy.step(ev)
    assert policy.phase is phase and isinstance(case.ev, kind)
    acts = policy.step(case.ev)
    want = case.want[host] if isinstance(case.want, dict) else case.want
    assert [type(a).__name__ for a in acts] == want
    assert policy.phase is (case.phase[host] if isinstance(case.phase, dict) else case.phase)
    if case.check is not None:
        case.check(policy, host, acts)


def _state(policy: P.RunPolicy) -> dict:
    """Everything the policy holds, comparable."""
    att = {k: v for k, v in vars(policy.att).items() if k != "hang"}
    skip = ("att", "liveness", "config")
    own = {k: v for k, v in vars(policy).items() if k not in skip}
    return repr((own, att, vars(policy.att.hang), vars(policy.liveness)))  # type: ignore[return-value]


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("row", IGNORED, ids=_row_id)
def test_ignored_row_changes_nothing(row: tuple[R, type], host: str) -> None:
    phase, kind = row
    policy = policy_for(host, BASE_OF[phase])
    assert policy.phase is phase
    before = _state(policy)
    assert policy.step(SAMPLES[kind]) == []
    assert _state(policy) == before


@pytest.mark.parametrize("row", REFUSED, ids=_row_id)
def test_refused_row_raises(row: tuple[R, type]) -> None:
    phase, kind = row
    policy = policy_for("coordinator", BASE_OF[phase])
    with pytest.raises(P.PolicyError):
        policy.step(SAMPLES[kind])


def test_both_hosts_drive_the_same_policy() -> None:
    """The console's supervisor and a detached run's coordinator import one RunPolicy, one table."""
    assert supervisor.RunPolicy is P.RunPolicy
    assert detached_run.pol.RunPolicy is P.RunPolicy and detached_run.pol.TABLE is P.TABLE
