"""What ClusterState keeps of each rank, node and attempt (state.py fills them; root_cause.py,
the summary and the TUI read them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mscon.agent.protocol import Evidence, ProcExited, ProcHung, RankResumed, is_scheduler
from mscon.console.engine.events import (
    AttemptOutcome,
    AttemptResume,
    Failure,
    NodeState,
    RankState,
    RankSummary,
)
from mscon.console.engine.log_tail import LogTail
from mscon.console.engine.loss_history import LossHistory

TAIL = 50  # last log lines kept per rank (the TUI's pane, the failure report)
HISTORY = 512  # (step, loss) points kept per rank for plots
# ... and in all: at 8,192 ranks or more each keeps fewer (64 at least), 64 MiB of points at most
HISTORY_BUDGET = 2**22


@dataclass(slots=True)
class RankView:
    name: str
    node: str
    rank: int
    state: RankState = RankState.PENDING
    pid: int | None = None
    started_ns: int | None = None
    last_progress_ns: int | None = None  # agent clock: last log line or metric
    last_step: int | None = None
    last_loss: float | None = None
    step_time_s: float | None = None
    samples_per_s: float | None = None
    device_memory_bytes: int | None = None
    device_memory_total: int | None = None
    device_util: float | None = None  # percent
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    exited: ProcExited | None = None
    hung: ProcHung | None = None
    next_seq: int = 0
    lost_lines: int = 0  # gaps in the log sequence numbers
    node_lines: int = 0  # lines its log has had on the node (NodeSummary: streamed or not, all kept)
    node_steps: int = 0  # metrics its node has read (NodeSummary)
    summarised: bool = False  # its node sends summaries: lines it was not subscribed to are no gap
    tail: LogTail = field(default_factory=lambda: LogTail(TAIL))
    history: LossHistory = field(default_factory=lambda: LossHistory(HISTORY))
    # Where it started this attempt (resume.py): its resume record, whether it stepped (a first
    # step or a metric), and its first metric's (epoch, step).
    resumed: RankResumed | None = None
    stepped: bool = False
    first_step: tuple[int | None, int] | None = None

    @property
    def is_scheduler(self) -> bool:
        return is_scheduler(self.rank)


@dataclass(slots=True)
class NodeView:
    name: str
    host: str = ""
    state: NodeState = NodeState.PENDING
    detail: str = ""
    lost_ns: int | None = None


@dataclass(slots=True)
class AttemptView:
    number: int
    started_ns: int = 0
    ended_ns: int | None = None
    outcome: AttemptOutcome | None = None
    reason: str = ""
    stop_reason: str | None = None
    failures: list[Failure] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    lost_nodes: list[Failure] = field(default_factory=list)
    root: Failure | None = None  # fixed when the attempt ends (AttemptEnded carries it)
    summary: tuple[RankSummary, ...] = ()
    warm: bool = False  # started on the standby cluster (AttemptStarted.warm)
    resume: AttemptResume | None = None  # where its ranks started: fixed when it ends (resume())
