"""Typed events the engine emits. Front ends (headless reporter, TUI) only consume these.

The agent's own messages (ProcStarted, LogBatch, Metric, Telemetry, ProcExited, AgentError) are
passed through unchanged; the classes below are what the console adds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mscon.agent.protocol import (
    AgentError,
    LogBatch,
    Message,
    Metric,
    ProcExited,
    ProcStarted,
    Telemetry,
)

__all__ = [
    "AgentError",
    "Event",
    "LogBatch",
    "LogsFetched",
    "Metric",
    "NodeState",
    "Notice",
    "NodeStatus",
    "ProcExited",
    "ProcStarted",
    "RankSummary",
    "ReplicaDivergence",
    "RunFinished",
    "RunResult",
    "RunStarted",
    "RunStatus",
    "RunStopping",
    "Telemetry",
]


class Event:
    """Marker base for console-side events (agent messages are events too)."""


class NodeStatus(enum.StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    DEPLOYING = "deploying"
    RUNNING = "running"
    DONE = "done"
    UNREACHABLE = "unreachable"
    LOST = "lost"


class RunStatus(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    UNREACHABLE = "unreachable"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    run_id: str
    inventory: str
    nodes: tuple[str, ...]
    world_size: int
    logs_dir: str


@dataclass(frozen=True, slots=True)
class NodeState(Event):
    node: str
    status: NodeStatus
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Notice(Event):
    """Something the operator should know that is not a failure (e.g. a very large workdir)."""

    text: str


@dataclass(frozen=True, slots=True)
class RunStopping(Event):
    """The engine is stopping every rank; ``root_cause`` is set when a rank failure caused it."""

    reason: str
    root_cause: ProcExited | None = None


@dataclass(frozen=True, slots=True)
class ReplicaDivergence(Event):
    """Data-parallel replicas must hold identical parameters; these ranks reported another digest."""

    step: int
    ranks: tuple[str, ...]  # rank names that differ from the majority
    majority: str


@dataclass(frozen=True, slots=True)
class LogsFetched(Event):
    node: str
    path: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RankSummary:
    node: str
    name: str
    rank: int
    status: str  # "ok", "exit 3", "SIGKILL", "stopped", "never started", ...
    exitcode: int | None
    signal: str | None
    last_step: int | None
    last_loss: float | None
    wall_s: float | None
    role: str = ""  # "root cause" or "" (victims are the stopped ranks)


@dataclass(frozen=True, slots=True)
class RunResult:
    run_id: str
    status: RunStatus
    exit_code: int
    reason: str
    root_cause: ProcExited | None
    ranks: tuple[RankSummary, ...]
    wall_s: float
    logs_dir: str
    divergent_ranks: tuple[str, ...] = ()

    def to_json(self) -> dict:
        rc = self.root_cause
        return {
            "run_id": self.run_id,
            "status": self.status.value,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "wall_s": round(self.wall_s, 3),
            "logs_dir": self.logs_dir,
            "divergent_ranks": list(self.divergent_ranks),
            "root_cause": None
            if rc is None
            else {
                "node": rc.node,
                "rank": rc.rank,
                "name": rc.name,
                "exitcode": rc.exitcode,
                "signal": rc.signal,
                "ts_ns": rc.ts_ns,
                "clock": f"agent clock on {rc.node}",
                "traceback": rc.traceback,
                "tail": list(rc.tail),
            },
            "ranks": [
                {
                    "node": r.node,
                    "rank": r.rank,
                    "name": r.name,
                    "status": r.status,
                    "exitcode": r.exitcode,
                    "signal": r.signal,
                    "last_step": r.last_step,
                    "last_loss": r.last_loss,
                    "wall_s": None if r.wall_s is None else round(r.wall_s, 3),
                    "role": r.role,
                }
                for r in self.ranks
            ],
        }


@dataclass(frozen=True, slots=True)
class RunFinished(Event):
    result: RunResult


AnyEvent = Event | Message
