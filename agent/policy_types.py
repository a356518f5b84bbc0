"""The run's policy's words (agent/policy.py has the machine): the inputs a host feeds it, the
actions it returns, and the vocabulary they share (``Outcome``, ``Status``: the same words on the
wire, in the journal, the events and the summary).

Pure and stdlib-only, Python 3.8, like the machine: the agent carries both to the nodes. Hosts
read these through ``policy`` (``policy.Begin``, ``policy.EndRun``, ...), which re-exports them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from . import protocol as P


class _Str(str, enum.Enum):
    def __str__(self) -> str:  # the value, as StrEnum prints (the agent's Python may be 3.8)
        return str(self.value)


class RunPhase(_Str):
    """Where the run is, for the policy (its table's first key). Not a rank's start-up milestone
    (``protocol.RankPhase``) nor the start-up time breakdown (``AttemptPhases``)."""

    IDLE = "idle"  # before the first attempt
    RUNNING = "running"
    STOPPING = "stopping"  # a stop went out; waiting for every node to be done
    BACKOFF = "backoff"  # between attempts: the next one starts at ``restart_at``
    AWAITING_OPERATOR = "awaiting operator"  # failed, no budget left, ranks stopped: r or q
    ENDED = "ended"


class Outcome(_Str):
    """How one attempt ended: the same words on the wire, in the journal, the events and the summary."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    RESTART_REQUESTED = "restart requested"  # by the operator: does not use up the restart budget
    DETACHED = "detached"  # the console left; the run goes on under its node-0 coordinator


class Status(_Str):
    """How the run ended (the final values of the console's JobState, and state.json's status)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    DETACHED = "detached"


class StopCause(_Str):
    FAILURE = "failure"
    OPERATOR = "operator"  # stop requested: the run ends
    RESTART = "restart"  # restart requested: the group goes again


# ------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class Begin:
    now: float


@dataclass(frozen=True)
class RankStarted:
    node: str
    name: str
    now: float


@dataclass(frozen=True)
class RankExited:
    node: str
    name: str
    worker: bool
    ok: bool
    stopped_by_agent: bool  # a victim of our own stop: not a failure
    detail: str  # "exit code 7", "SIGKILL"
    now: float


@dataclass(frozen=True)
class RankStepped:
    """A rank's first step (the agent read its first metric): the attempt is past start-up."""

    node: str
    name: str
    now: float


@dataclass(frozen=True)
class RankHung:
    node: str
    name: str
    why: str
    now: float


@dataclass(frozen=True)
class AgentFailed:
    node: str
    message: str
    now: float


@dataclass(frozen=True)
class NodeDone:
    """Every process of the node's current attempt has exited."""

    node: str
    now: float


@dataclass(frozen=True)
class NodeLost:
    node: str
    why: str
    now: float


@dataclass(frozen=True)
class StopRequested:
    reason: str
    exit_code: int
    now: float


@dataclass(frozen=True)
class RestartRequested:
    reason: str
    now: float


@dataclass(frozen=True)
class StandbyChanged:
    """A node's spares for ``attempt`` are joining their standby cluster, have all joined it
    (ready), or one is gone (lost). ``state`` may be given as a bool: ready, else lost."""

    node: str
    attempt: int
    state: P.StandbyPhase
    now: float
    why: str = ""  # what is gone, when lost

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", P.standby_phase(self.state))

    @property
    def ready(self) -> bool:
        return self.state is P.StandbyPhase.READY

    @property
    def joining(self) -> bool:
        """Not news to the operator (no standby yet, none lost): only the policy's wait reads it."""
        return self.state is P.StandbyPhase.JOINING


@dataclass(frozen=True)
class AwaitAdoption:
    """Before Begin: these nodes were asked to adopt a kept standby for attempt 0; attempt 0 waits
    for each one's word (its StandbyChanged) up to ``policy.ADOPT_WAIT_S``."""

    nodes: tuple[str, ...]
    now: float


@dataclass(frozen=True)
class Heard:
    """Word from a peer over its link (any message): a detached coordinator's from a follower, a
    follower's from its coordinator (``liveness.Liveness``)."""

    node: str
    now: float


@dataclass(frozen=True)
class LinkLost:
    """A peer's link ended: not yet a lost peer (a follower dials again within the watchdog)."""

    node: str
    now: float


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class Resume:
    """Take over ``attempt``, already running (a detached run's coordinator), with the nodes whose
    standby for the next attempt had said it was ready."""

    attempt: int
    now: float
    standby_ready: tuple[str, ...] = ()


@dataclass(frozen=True)
class RankProgress:
    """A rank made progress (a log line, a metric) at ``now`` (the console's word)."""

    name: str
    now: float


@dataclass(frozen=True)
class StepReport:
    """A step report of a rank: progress, and the pace its hang limit follows (``ts``: its clock)."""

    name: str
    ts: float
    now: float


@dataclass(frozen=True)
class ProgressReport:
    """What a detached coordinator hears of a rank from its node's agent (``LinkProgress``): its
    last progress ``at`` on this host's clock (None: none new), and its step pace as the agent's
    ``HangRule`` has it (``HangRule.pace``: (last ts, longest gap), or None)."""

    name: str
    at: float | None
    pace: tuple | None


Input = Union[  # noqa: UP007 - evaluated at run time, on Python 3.8
    AwaitAdoption,
    Begin,
    RankStarted,
    RankExited,
    RankStepped,
    RankHung,
    AgentFailed,
    NodeDone,
    NodeLost,
    StopRequested,
    RestartRequested,
    StandbyChanged,
    Heard,
    LinkLost,
    Tick,
    Resume,
    RankProgress,
    StepReport,
    ProgressReport,
]

# Every input type, in the order the policy's table lists them.
INPUTS: tuple[type, ...] = Input.__args__  # type: ignore[attr-defined]


def from_message(node: str, msg: P.Message, now: float) -> Input | None:
    """An agent's lifecycle message as the policy's input (None: not the policy's business).
    Both hosts translate with this, so a message means the same to both."""
    if isinstance(msg, P.ProcStarted):
        return RankStarted(node, msg.name, now)
    if isinstance(msg, P.ProcExited):
        worker = not P.is_scheduler(msg.rank)
        return RankExited(node, msg.name, worker, msg.ok, msg.stopped_by_agent, msg.describe(), now)
    if isinstance(msg, P.ProcHung):
        return RankHung(node, msg.name, msg.why, now)
    if isinstance(msg, P.AgentError):
        return AgentFailed(node, msg.message, now)
    if isinstance(msg, P.AllExited):
        return NodeDone(node, now)
    if isinstance(msg, P.RankPhase) and msg.phase == P.Milestone.FIRST_STEP:
        return RankStepped(node, msg.name, now)
    if isinstance(msg, P.StandbyState):
        return StandbyChanged(node, msg.attempt, msg.state, now, msg.why)
    return None


# ------------------------------------------------------------------ actions


@dataclass(frozen=True)
class StartAttempt:
    attempt: int
    warm: bool = False  # on the standby cluster every node's spares joined (Start.warm)


@dataclass(frozen=True)
class StopAll:
    reason: str
    trigger: str | None  # the process (or node) that caused it; None for the operator's
    announce: bool  # the attempt's first stop (hosts announce it once; later ones only re-send)


@dataclass(frozen=True)
class StopScheduler:
    reason: str = "scheduler outlived the workers"


@dataclass(frozen=True)
class Inspect:
    node: str
    names: tuple[str, ...]
    reason: str
    silent_s: float  # the limit they passed: their agent checks it on its own clock


@dataclass(frozen=True)
class CutOff:
    """These nodes did not confirm the stop in time: drop them (their agents stop their ranks)."""

    nodes: tuple[str, ...]
    why: str = "did not confirm the stop in time"


@dataclass(frozen=True)
class StopNode:
    """A node whose link came back while the attempt stops: the stop it may have missed, again."""

    node: str
    reason: str


@dataclass(frozen=True)
class RestartRefused:
    """A restart request the policy will not carry out now (the host tells whoever asked)."""

    reason: str


@dataclass(frozen=True)
class Redial:
    """A follower's link to ``node`` (its coordinator) ended: dial it again."""

    node: str


@dataclass(frozen=True)
class PeerLost:
    """No word from ``node`` for the watchdog period: a coordinator's follower is lost (the policy
    says ``CutOff``), a follower's coordinator gone (it stops its ranks and ends)."""

    node: str
    why: str


@dataclass(frozen=True)
class Force:
    """A second stop request: stop waiting for the agents."""


@dataclass(frozen=True)
class AttemptOver:
    attempt: int
    outcome: Outcome
    reason: str = ""  # the operator's, for an interrupted attempt


@dataclass(frozen=True)
class Restarting:
    attempt: int  # the attempt that comes next
    why: str
    backoff_s: float
    restarts_left: int


@dataclass(frozen=True)
class AwaitOperator:
    attempt: int  # the failed attempt
    wait_s: float | None  # None: for as long as the console stays


@dataclass(frozen=True)
class Verdict:
    """How the run ended. ``exit_code``/``reason`` None: the failed attempt's root cause's (the host
    computes root causes; the policy never reads a log)."""

    status: Status
    reason: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class EndRun:
    verdict: Verdict


Action = Union[  # noqa: UP007 - evaluated at run time, on Python 3.8
    StartAttempt,
    StopAll,
    StopScheduler,
    Inspect,
    CutOff,
    StopNode,
    RestartRefused,
    Redial,
    PeerLost,
    Force,
    AttemptOver,
    Restarting,
    AwaitOperator,
    EndRun,
]
