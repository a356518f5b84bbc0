"""Console events: the contract between the engine and every front end (reporter, TUI, recorder).

Every event is a frozen dataclass registered under a ``kind`` tag, carries the attempt number, and
round-trips through JSON (``to_json``/``from_json``), so a recorded run (``mscon run --events``)
replays into the same ClusterState. The agent's wire messages are wrapped in ``AgentEvent``, never
passed through bare: the attempt they belong to is the console's knowledge, not the agent's.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from mscon.agent import protocol as wire
from mscon.agent.policy import Outcome
from mscon.agent.protocol import Message
from mscon.console.engine import exit_codes

_EVENTS: dict[str, type[Event]] = {}


class NodeState(enum.StrEnum):
    PENDING = "pending"
    CONNECTING = "connecting"
    DEPLOYING = "deploying"
    READY = "ready"  # agent up, protocol checked, no ranks of the current attempt yet
    RUNNING = "running"
    DONE = "done"  # every process of the current attempt has exited
    UNREACHABLE = "unreachable"
    LOST = "lost"


class RankState(enum.StrEnum):
    PENDING = "pending"
    STARTING = "starting"  # process started, no progress seen yet
    RUNNING = "running"
    HUNG = "hung"  # stopped by a signal (state T) or no progress for hang.timeout_s
    EXITED_OK = "exited ok"
    FAILED = "failed"  # exited non-zero on its own
    STOPPED = "stopped"  # stopped by mscon (a victim of a stop)
    LOST = "lost"  # its node was lost

    @property
    def live(self) -> bool:
        return self in (RankState.STARTING, RankState.RUNNING, RankState.HUNG)


class JobState(enum.StrEnum):
    """The run as a whole; the last five are final (torchrun's WorkerState, for a whole cluster)."""

    CONNECTING = "connecting"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    AWAITING_OPERATOR = "awaiting operator"  # failed, ranks stopped, agents kept: r restarts, q ends
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    UNREACHABLE = "unreachable"
    ERROR = "error"
    DETACHED = "detached"  # still running on the nodes, with no console (mscon attach RUN_ID)

    @property
    def final(self) -> bool:
        return self in _FINAL


_FINAL = {
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.INTERRUPTED,
    JobState.UNREACHABLE,
    JobState.ERROR,
    JobState.DETACHED,
}


# One vocabulary from the wire to the summary: the policy's own words (agent/policy.py).
AttemptOutcome = Outcome


class CheckStatus(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    NA = "n/a"


class PhaseOrigin(enum.StrEnum):
    """What an attempt's start-up breakdown counts from (``AttemptPhases.origin``)."""

    LAUNCH = "launch"  # the console began connecting to the nodes (the run's first attempt)
    FAULT = "fault"  # the previous attempt's root cause failed (a hang: its last progress)
    STOP = "stop"  # the previous attempt began stopping (a restart no failure caused: the operator's)
    START = "start"  # the attempt's own start: nothing earlier is known (an attached console)


class GraphLoad(enum.StrEnum):
    """How an attempt's workers got their first step's graph (``AttemptPhases.graph``), from their
    compiled milestones (wire.GraphSource): the run's compile cache on the node, or compiled."""

    LOADED = "loaded"  # every worker loaded it
    COMPILED = "compiled"  # every worker compiled it
    MIXED = "mixed"  # some loaded it, some compiled it


class StartSource(enum.StrEnum):
    """Where a rank of an attempt started (``RankStart.source``): its resume record's source
    (wire.ResumeSource), or what its first step says where it wrote none."""

    SNAPSHOT = wire.ResumeSource.SNAPSHOT  # resumed from a state copy in node memory
    CHECKPOINT = wire.ResumeSource.CHECKPOINT  # resumed from a durable checkpoint
    FRESH = wire.ResumeSource.NONE  # the resume library ran and found nothing: step 0
    REFUSED = wire.ResumeSource.REFUSED  # it could not restore a state exactly: stopped before its first step
    STARTED_OVER = "started over"  # stepped with no resume record: the script does not resume
    UNRECORDED = "unrecorded"  # no record, but its first step came after the run's first: its own resume
    UNKNOWN = "unknown"  # neither a record nor a step yet


class ResumeVerdict(enum.StrEnum):
    """Where an attempt's ranks started, taken together (``AttemptResume.verdict``, resume.py)."""

    RESUMED = "resumed"  # every rank from a snapshot or checkpoint, all at the same step
    FRESH = "fresh"  # every rank's resume library found nothing: step 0
    STARTED_OVER = "started over"  # no rank wrote a resume record: the script does not resume
    UNRECORDED = "unrecorded"  # no record, every rank went on past the run's first step by itself
    REFUSED = "refused"  # a rank refused to resume (whatever the others did): the relaunch stopped
    MIXED = "mixed"  # the ranks started from different steps or in different ways
    UNKNOWN = "unknown"  # no rank has said yet


class FailureKind(enum.StrEnum):
    EXIT = "exit"  # exited with a non-zero code on its own
    SIGNAL = "signal"  # killed by a signal nobody in mscon sent
    STOPPED = "stopped"  # process state T: stopped by SIGSTOP/SIGTSTP, makes no progress
    HUNG = "hung"  # no progress (log line or metric) for hang.timeout_s
    NAMED = "named"  # named by MindSpore's own timeout evidence (the scheduler, HCCL)
    NODE_LOST = "node lost"  # the node's agent connection ended
    AGENT = "agent"  # the agent could not prepare or start the node's processes


# Exit codes for failures without a process exit code of their own (see README "Exit codes").
HANG_EXIT_CODE = exit_codes.HUNG
NODE_LOST_EXIT_CODE = exit_codes.UNREACHABLE


class Event:
    """Base of console events. Subclasses are frozen dataclasses with ``attempt`` first."""

    kind: ClassVar[str] = ""
    attempt: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        tag = cls.__dict__.get("kind")
        if tag:  # dataclass(slots=True) re-creates the class: the second registration replaces the first
            previous = _EVENTS.get(tag)
            if previous is not None and previous.__qualname__ != cls.__qualname__:
                raise TypeError(f"duplicate event kind {tag!r}")
            _EVENTS[tag] = cls


# ------------------------------------------------------------------ values carried by events


@dataclass(frozen=True, slots=True)
class RankRef:
    name: str  # "r3" or "sched"
    node: str
    rank: int  # wire.SCHEDULER_RANK for the scheduler


@dataclass(frozen=True, slots=True)
class Failure:
    """One thing that went wrong in an attempt; the root cause is one of these (state.root_cause)."""

    kind: FailureKind
    node: str
    name: str  # rank name ("r3", "sched"), or the node name for NODE_LOST / AGENT
    rank: int | None
    ts_ns: int  # when it stopped making progress or exited, on ``clock``
    clock: str  # whose clock ts_ns is: "agent on NODE" or "console"
    code: int  # what a shell would report for it (128 + signal, 124 for a hang, 4 for a lost node)
    # One line: for an exit ProcExited.describe() ("exit code 7", "killed by SIGKILL"), for a hang
    # what the agent saw ("stopped by a signal: process state T (stopped)").
    detail: str
    exitcode: int | None = None
    signal: str | None = None
    tail: tuple[str, ...] = ()
    traceback: str | None = None
    stack: str | None = None  # where a hung rank was stuck (py-spy dump, or kernel wchan)
    evidence: str | None = None  # MindSpore's own line that names this rank
    wchan: str | None = None  # a hung rank's kernel wait channel


@dataclass(frozen=True, slots=True)
class RankSummary:
    node: str
    name: str
    rank: int
    status: str  # "ok", "exit 3", "SIGKILL", "stopped (SIGTERM)", "hung", "never started", ...
    exitcode: int | None
    signal: str | None
    last_step: int | None
    last_loss: float | None
    wall_s: float | None
    role: str = ""  # "root cause", "victim" or ""


@dataclass(frozen=True, slots=True)
class AttemptPhases:
    """Where an attempt's start-up went: seconds from ``origin`` to each milestone, None where it is
    unknown or was not reached (computed by ClusterState, console/engine/phases.py). A milestone of
    several nodes or ranks is the last of them to reach it; rank milestones count workers only, each
    by its node's clock (the console's for connected .. launched). The fields are in time order."""

    origin: PhaseOrigin
    warm: bool = False  # on the standby cluster joined during the attempt before (no join here)
    # a restart's way down (the previous attempt)
    detected: float | None = None  # mscon began stopping every rank
    stopped: float | None = None  # its last process exited
    # the way up
    connected: float | None = None  # every node connected (a restart: a node reconnected)
    agent_up: float | None = None  # every agent up
    checks_done: float | None = None  # the preflight finished
    launched: float | None = None  # the console started the attempt (a restart: after its backoff)
    spawned: float | None = None  # every process of the attempt started
    imported: float | None = None  # every worker imported MindSpore (the rank's own record)
    joined: float | None = None  # MindSpore's cluster init() returned on every worker (same)
    ready: float | None = None  # model and data built on every worker: first steps begin (same)
    compiled: float | None = None  # every worker's first step returned: graphs compiled (same)
    first_step: float | None = None  # every worker reported its first step (any script)
    # how that first step got its graph, once every worker said (None: not said; a script without
    # mscon_resume, or no compile cache)
    graph: GraphLoad | None = None


@dataclass(frozen=True, slots=True)
class RankStart:
    """Where one rank of an attempt started (console/engine/resume.py). ``step``/``epoch``: its
    resume record's (the global step it resumes after; 0-based epoch); ``first_step``/
    ``first_epoch``: its first metric of the attempt, as reported (None: not seen); ``reason``: why
    it refused to resume (REFUSED; None: not said)."""

    name: str
    node: str
    rank: int
    source: StartSource
    step: int | None = None
    epoch: int | None = None
    first_step: int | None = None
    first_epoch: int | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptResume:
    """Where an attempt's ranks started: the verdict (one function computes it: resume.verdict),
    the step they all resumed after (RESUMED, FRESH), each worker's start, and (RESUMED) how many
    steps are computed again: the largest step the previous attempt's ranks reported less ``step``
    (None: not known; resume.frontier says which attempt counts as the previous one)."""

    verdict: ResumeVerdict
    step: int | None
    ranks: tuple[RankStart, ...]
    recomputed: int | None = None


@dataclass(frozen=True, slots=True)
class AttemptSummary:
    attempt: int
    outcome: AttemptOutcome
    reason: str
    wall_s: float
    root_cause: Failure | None
    ranks: tuple[RankSummary, ...]
    phases: AttemptPhases | None = None
    resume: AttemptResume | None = None  # where its ranks started (console/engine/resume.py)


@dataclass(frozen=True, slots=True)
class StragglerSummary:
    """A rank flagged as a straggler during one attempt (the summary's record of it)."""

    attempt: int
    name: str
    node: str
    step_time_s: float  # its median step time when last flagged
    median_s: float  # the other ranks' median then
    flagged: int  # how many times it was flagged in that attempt
    cleared: bool  # it caught up again afterwards


@dataclass(frozen=True, slots=True)
class FetchSummary:
    """What came back of one node's run folder at the end (the summary's record of it)."""

    node: str
    path: str
    bytes: int
    seconds: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RunResult:
    run_id: str
    status: JobState
    exit_code: int
    reason: str
    root_cause: Failure | None  # of the last failed attempt
    ranks: tuple[RankSummary, ...]  # of the last attempt
    wall_s: float
    logs_dir: str
    attempts: tuple[AttemptSummary, ...] = ()
    divergent_ranks: tuple[str, ...] = ()
    dropped: tuple[tuple[str, int], ...] = ()  # (sink, metric updates it lost by lagging)
    stragglers: tuple[StragglerSummary, ...] = ()
    fetched: tuple[FetchSummary, ...] = ()  # each node's run folder copied back (logs, not checkpoints)

    def to_json(self) -> dict[str, Any]:
        return typing.cast(dict[str, Any], dump(self))


# ------------------------------------------------------------------ the events


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    kind: ClassVar[str] = "run_started"
    attempt: int
    run_id: str
    inventory: str
    nodes: tuple[str, ...]
    world_size: int
    logs_dir: str
    max_restarts: int = 0
    hosts: tuple[str, ...] = ()  # as the inventory gives them (ssh-config aliases, names, IPs)


@dataclass(frozen=True, slots=True)
class NodeUpdate(Event):
    kind: ClassVar[str] = "node"
    attempt: int
    node: str
    state: NodeState
    detail: str = ""
    ts_ns: int = 0  # console clock


@dataclass(frozen=True, slots=True)
class AttemptStarted(Event):
    kind: ClassVar[str] = "attempt_started"
    attempt: int
    ranks: tuple[RankRef, ...]
    sched_host: str
    sched_port: int
    ts_ns: int = 0
    warm: bool = False  # its processes are the standby cluster's, joined during the attempt before


@dataclass(frozen=True, slots=True)
class AgentEvent(Event):
    """A message from a node's agent, stamped with the attempt it belongs to."""

    kind: ClassVar[str] = "agent"
    attempt: int
    msg: Message


@dataclass(frozen=True, slots=True)
class Stopping(Event):
    """mscon is stopping every rank on every node; ``trigger`` is what made it (not the verdict)."""

    kind: ClassVar[str] = "stopping"
    attempt: int
    reason: str
    trigger: str | None = None  # rank or node name
    ts_ns: int = 0  # console clock (a detached run's: its coordinator's); 0: not known


@dataclass(frozen=True, slots=True)
class AttemptEnded(Event):
    kind: ClassVar[str] = "attempt_ended"
    attempt: int
    outcome: AttemptOutcome
    reason: str
    root_cause: Failure | None = None
    ts_ns: int = 0


@dataclass(frozen=True, slots=True)
class Restarting(Event):
    kind: ClassVar[str] = "restarting"
    attempt: int  # the attempt about to start
    reason: str
    backoff_s: float
    restarts_left: int


@dataclass(frozen=True, slots=True)
class AwaitingOperator(Event):
    """The attempt failed with no restart left; its ranks are stopped, the agents and connections
    kept: the operator's restart starts the next attempt, a stop ends the run with this verdict."""

    kind: ClassVar[str] = "awaiting_operator"
    attempt: int  # the failed attempt
    reason: str
    wait_s: float | None = None  # None: for as long as the console stays


@dataclass(frozen=True, slots=True)
class StandbyUpdated(Event):
    """A node's spares for the coming attempt joined their standby cluster (``ready``), or one is
    gone (``why``); ``warm``: every node's has joined now, so a restart starts that attempt on the
    standby cluster, skipping the cluster join (the policy's ``warm_for``: the one rule)."""

    kind: ClassVar[str] = "standby_updated"
    attempt: int  # the attempt the standby is for (the next one)
    node: str
    ready: bool
    warm: bool
    why: str = ""


@dataclass(frozen=True, slots=True)
class Notice(Event):
    """Something the operator should know that is not a failure (a huge workdir, a lagging view)."""

    kind: ClassVar[str] = "notice"
    attempt: int
    text: str


@dataclass(frozen=True, slots=True)
class LinesShown(Event):
    """How far each rank's log was already shown, by the console that detached the run: an attach
    replays from there, and the lines before are not lost lines."""

    kind: ClassVar[str] = "lines_shown"
    attempt: int
    log_seq: tuple[tuple[str, int], ...]  # (rank name, lines shown)


@dataclass(frozen=True, slots=True)
class ReplicaDivergence(Event):
    """Data-parallel replicas must hold identical parameters; these ranks reported another digest."""

    kind: ClassVar[str] = "divergence"
    attempt: int
    step: int
    ranks: tuple[str, ...]
    majority: str


@dataclass(frozen=True, slots=True)
class StragglerFlagged(Event):
    """This rank's recent step time is ``factor`` or more times the other ranks' median (stragglers.py)."""

    kind: ClassVar[str] = "straggler_flagged"
    attempt: int
    name: str
    node: str
    step: int  # its last step when flagged
    step_time_s: float  # its median step time over the window
    median_s: float  # the median of the other ranks' medians
    factor: float  # the threshold in force (--straggler-factor)


@dataclass(frozen=True, slots=True)
class StragglerCleared(Event):
    """A flagged rank's step time came back near the others' (below ``StragglerPolicy.release``)."""

    kind: ClassVar[str] = "straggler_cleared"
    attempt: int
    name: str
    node: str
    step: int
    step_time_s: float
    median_s: float


@dataclass(frozen=True, slots=True)
class LogsFetched(Event):
    kind: ClassVar[str] = "logs_fetched"
    attempt: int
    node: str
    path: str
    error: str | None = None
    bytes: int = 0  # copied back
    seconds: float = 0.0  # the copy took


@dataclass(frozen=True, slots=True)
class FetchProgress(Event):
    """The run folders coming back at the end, so far (every half second while they come)."""

    kind: ClassVar[str] = "fetch_progress"
    attempt: int
    bytes: int
    nodes_done: int
    nodes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CheckReported(Event):
    """One preflight result of one node ("*" for checks across nodes: skew, mesh, scheduler)."""

    kind: ClassVar[str] = "check"
    attempt: int
    node: str
    name: str
    status: CheckStatus
    value: str = ""
    remedy: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ChecksFinished(Event):
    kind: ClassVar[str] = "checks_finished"
    attempt: int
    failed: tuple[str, ...] = ()  # "node: check" of each fail
    skipped: tuple[str, ...] = ()  # checks the operator skipped (--skip-check), recorded
    ts_ns: int = 0  # console clock; 0: not known


@dataclass(frozen=True, slots=True)
class RunFinished(Event):
    kind: ClassVar[str] = "run_finished"
    attempt: int
    result: RunResult


# ------------------------------------------------------------------ JSON


def dump(value: Any) -> Any:
    """JSON-ready form of an event or of anything events carry."""
    if isinstance(value, Message):
        return {k: dump(v) for k, v in value.to_dict().items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"kind": value.kind} if isinstance(value, Event) else {}
        for f in dataclasses.fields(value):
            out[f.name] = dump(getattr(value, f.name))
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): dump(v) for k, v in value.items()}
    return value


def to_json(event: Event) -> dict[str, Any]:
    return typing.cast(dict[str, Any], dump(event))


def json_default(value: Any) -> Any:
    """``dump`` one level at a time, as ``json``'s ``default``: what it returns holds the value's
    fields as they are, and the encoder comes back here for each that is not plain JSON. A summary
    of 80,000 ranks is then written without the whole tree of dicts ``dump`` builds (twice its
    ranks: the run's and its last attempt's), the end of a run's peak of memory. Same JSON as
    ``json.dumps(dump(value))``: enums that are str or int encode as their value there too."""
    if isinstance(value, Message):
        return dump(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"kind": value.kind} if isinstance(value, Event) else {}
        for name in wire.field_names(type(value)):
            v = getattr(value, name)
            out[name] = dump(v) if isinstance(v, dict) else v  # its keys as dump writes them
        return out
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def from_json(raw: dict[str, Any]) -> Event:
    """The event ``to_json`` produced; ValueError for anything else."""
    cls = _EVENTS.get(str(raw.get("kind")))
    if cls is None:
        raise ValueError(f"unknown event kind {raw.get('kind')!r}")
    return typing.cast(Event, _load(cls, raw))


def result_from_json(raw: dict[str, Any]) -> RunResult:
    """The RunResult ``RunResult.to_json`` produced (a summary file; extra sections are ignored);
    ValueError, TypeError or KeyError for anything else."""
    if not isinstance(raw, dict):
        raise ValueError("not a run summary")
    return typing.cast(RunResult, _load(RunResult, raw))


def _load(tp: Any, raw: Any) -> Any:
    if raw is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _load(args[0], raw) if len(args) == 1 else raw
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_load(args[0], v) for v in raw)
        return tuple(_load(a, v) for a, v in zip(args, raw, strict=False))
    if origin is dict or tp is Any:
        return raw
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            return tp(raw)
        if issubclass(tp, Message):
            body = dict(raw)
            msg_cls = wire.message_class(str(body.pop("type", "")))
            return wire.from_dict(msg_cls, body)
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            kwargs = {
                f.name: _load(hints[f.name], raw[f.name]) for f in dataclasses.fields(tp) if f.name in raw
            }
            return tp(**kwargs)
    return raw
