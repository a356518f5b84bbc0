"""Start-up progress (connect, deploy, checks, ranks, and where the time went), computed from
ClusterState alone."""

from __future__ import annotations

from dataclasses import dataclass

from mscon.console.engine.events import CheckStatus, NodeState
from mscon.console.engine.phases import describe_phases
from mscon.console.engine.state import ClusterState

_CONNECTED = {NodeState.DEPLOYING, NodeState.READY, NodeState.RUNNING, NodeState.DONE, NodeState.LOST}
_DEPLOYED = {NodeState.READY, NodeState.RUNNING, NodeState.DONE, NodeState.LOST}


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    done: int
    total: int
    failed: int = 0  # nodes that could not get through this phase (unreachable, failed checks)
    skipped: bool = False  # no preflight in this run

    @property
    def complete(self) -> bool:
        return self.skipped or self.done + self.failed >= self.total


def phases(state: ClusterState) -> tuple[Phase, ...]:
    n = len(state.nodes)
    counts = state.node_states()  # counted as the events come: no scan of 10,000 nodes per frame
    unreachable = counts.get(NodeState.UNREACHABLE, 0)
    connect = Phase("connect", sum(counts.get(s, 0) for s in _CONNECTED), n, unreachable)
    deploy = Phase("deploy", sum(counts.get(s, 0) for s in _DEPLOYED), n, unreachable)
    failed = len(state.failing_nodes())
    if state.checks_finished is not None:
        checks = Phase("checks", n - failed, n, failed)
    elif not state.checks and state.attempts:
        checks = Phase("checks", 0, n, skipped=True)
    else:
        checks = Phase("checks", state.checked_nodes() - failed, n, failed)
    total = sum(state.worker_states().values()) or state.world_size
    ranks = Phase("ranks", state.workers_started(), total)
    return connect, deploy, checks, ranks


def starting(state: ClusterState) -> bool:
    """Still starting up: the panel shows until every worker of the current attempt has reached its
    first step (its breakdown, ``ClusterState.phases``, is complete), or the attempt has ended."""
    if state.job.final:
        return False
    if not all(p.complete for p in phases(state)):
        return True
    att = state.attempt
    if att is None or att.outcome is not None:
        return False
    timed = state.phases()
    if timed is not None and timed.first_step is not None:
        return False
    # An agent that says no first step (a recording made before it did): the workers' metrics do.
    return state.workers_stepped() < state.worker_count()


def breakdown(state: ClusterState) -> str | None:
    """The current attempt's start-up so far, in words (``phases.describe_phases``)."""
    timed = state.phases()
    return describe_phases(timed) if timed is not None else None


def checks_verdict(state: ClusterState) -> CheckStatus | None:
    """Once the preflight is over: FAIL (the run will not launch: show the Checks screen), WARN
    (the run goes on: say so), else None."""
    if state.checks_finished is None:
        return None
    found = {ev.status for ev in state.checks.values()}
    for status in (CheckStatus.FAIL, CheckStatus.WARN):
        if status in found:
            return status
    return None
