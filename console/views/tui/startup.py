"""Start-up progress (connect, deploy, checks, ranks), computed from ClusterState alone."""

from __future__ import annotations

from dataclasses import dataclass

from mscon.console.engine.events import CheckStatus, NodeState
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
    nodes = list(state.nodes.values())
    n = len(nodes)
    unreachable = sum(v.state is NodeState.UNREACHABLE for v in nodes)
    connect = Phase("connect", sum(v.state in _CONNECTED for v in nodes), n, unreachable)
    deploy = Phase("deploy", sum(v.state in _DEPLOYED for v in nodes), n, unreachable)
    checked = {node for node, _ in state.checks if node != "*"}
    failed = {node for (node, _), ev in state.checks.items() if ev.status is CheckStatus.FAIL and node != "*"}
    if state.checks_finished is not None:
        checks = Phase("checks", n - len(failed), n, len(failed))
    elif not state.checks and state.attempts:
        checks = Phase("checks", 0, n, skipped=True)
    else:
        checks = Phase("checks", len(checked - failed), n, len(failed))
    workers = state.workers()
    total = len(workers) or state.world_size
    ranks = Phase("ranks", sum(r.started_ns is not None for r in workers), total)
    return connect, deploy, checks, ranks


def starting(state: ClusterState) -> bool:
    """Still starting up: the panel shows until every rank of the first attempt has started."""
    if state.job.final:
        return False
    return not all(p.complete for p in phases(state))


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
