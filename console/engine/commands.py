"""Commands into the engine: typed, queued, awaited by the supervisor (never polled)."""

from __future__ import annotations

from dataclasses import dataclass

from mscon.console.engine import exit_codes


@dataclass(frozen=True, slots=True)
class StopJob:
    """Stop every rank on every node and end the run. A second StopJob forces (cuts the channels)."""

    reason: str = "stop requested"
    exit_code: int = exit_codes.INTERRUPTED  # 141 when our own output was closed (SIGPIPE convention)


@dataclass(frozen=True, slots=True)
class RestartGroup:
    """Restart the whole group from its latest checkpoint (a rank cannot rejoin a running collective
    on CPU or Ascend). Does not use up the failure restart budget."""

    reason: str = "restart requested by the operator"


@dataclass(frozen=True, slots=True)
class DetachRun:
    """Leave the run going on the nodes with no console: the agents become daemons and node 0's
    agent carries the run's policy (stop on failure, group restarts); ``mscon attach`` comes back."""

    reason: str = "detached by the operator"


Command = StopJob | RestartGroup | DetachRun
