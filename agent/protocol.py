"""The wire protocol between the console and the node agent: JSON lines, one message a line.

Both sides import this module (the console as ``mscon.agent.protocol``, the agent through a
relative import), so a message is defined once. Stdlib only, and Python 3.8 syntax at run time,
because it runs with whatever Python the nodes have.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

# 2: attempts, hang reports, blame evidence, name resolution; 3: detach/attach, metric and
# telemetry batches
# 4: typed coordinator links, the run's policy in agent/policy.py (one outcome vocabulary)
# 5: rank start-up milestones (RankPhase)
# 6: standby clusters (Start.join_standby/warm, LinkStart.warm, StandbyState)
# 7: kept standbys (Adopt, Shutdown.keep_warm_s)
# 8: where a rank resumed (RankResumed, from its resume record)
# 9: alarms first, lines by subscription (Subscribe, NodeSummary; issue 44)
# 10: a standby's state (StandbyState.state: joining, ready, lost; issue 43)
PROTOCOL_VERSION = 10

# The scheduler process is not a rank; it gets this rank number and the name "sched".
SCHEDULER_RANK = -1
SCHEDULER_NAME = "sched"


def is_scheduler(rank: int | None) -> bool:
    """Whether a process's rank is the scheduler's (None, no process at all, is not)."""
    return rank == SCHEDULER_RANK


def rank_name(rank: int) -> str:
    """A process's name: "r3" for global rank 3, "sched" for the scheduler (logs, views, the wire)."""
    return SCHEDULER_NAME if is_scheduler(rank) else "r%d" % rank


def rank_of(name: str) -> int | None:
    """The rank a process name stands for (``rank_name`` read back); None for a name mscon does
    not give a process."""
    if name == SCHEDULER_NAME:
        return SCHEDULER_RANK
    digits = name[1:]
    if name[:1] == "r" and digits.isdigit() and digits.isascii() and rank_name(int(digits)) == name:
        return int(digits)
    return None


def by_rank(name: str) -> tuple[int, str]:
    """Sort key for process names: in rank order, the scheduler first (other names after)."""
    rank = rank_of(name)
    return (rank if rank is not None else 1 << 62, name)


_REGISTRY: dict[str, type[Message]] = {}


class ProtocolError(ValueError):
    """A line that is not a valid message."""


@dataclass(frozen=True)
class Message:
    """Base of every message; subclasses register under their ``type`` tag."""

    type: ClassVar[str] = ""
    # A follower of a detached run reports it to its coordinator: what the run's policy needs.
    reported: ClassVar[bool] = False
    # Kept in the node's journal (agent/journal.py): what a console needs to rebuild the run. Logs,
    # metrics and telemetry are not (the log files hold the lines; state.json each rank's last metric).
    journaled: ClassVar[bool] = False
    # Bulk output of the ranks: counted against the outbox's budget, and left waiting in the ranks'
    # files while the console is behind (lifecycle messages are never held back).
    streamed: ClassVar[bool] = False
    # A sample the next one supersedes (metrics, telemetry): a view that lags may skip it
    # (console/engine/bus.py); log lines and lifecycle messages are never skipped.
    sampled: ClassVar[bool] = False
    # What the policy must hear before any backlog (an exit, a hang, blame, the agent's own error):
    # the agent's outbox writes it ahead of the log and metric batches queued before it.
    alarm: ClassVar[bool] = False
    # Fields kept off the coordinator link (log tails, stacks): the policy never reads them (the
    # link is TLS, but what it need not carry it does not).
    off_link: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        tag = cls.__dict__.get("type")
        if tag:
            if tag in _REGISTRY:
                raise TypeError(f"duplicate message type {tag!r}")
            _REGISTRY[tag] = cls

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        for name in field_names(type(self)):
            out[name] = _plain(getattr(self, name))
        return out


_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, worked out once per class (not dataclasses.fields per message or
    per rank of a summary)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _plain(value: Any) -> Any:
    """A field's value as JSON takes it: a dataclass (or a tuple of them) as the dict
    ``dataclasses.asdict`` makes, without its deep copy of every dict and tuple inside (each rank's
    environment in a Start: most of the console's start-up CPU at 1,000 nodes)."""
    if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain(getattr(value, name)) for name in field_names(type(value))}
    return value


def encode(msg: Message) -> str:
    """One JSON line, newline included."""
    return json.dumps(msg.to_dict(), separators=(",", ":"), allow_nan=True) + "\n"


def decode(line: str) -> Message:
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {line[:120]!r}") from exc
    if not isinstance(raw, dict) or "type" not in raw:
        raise ProtocolError(f"not a message: {line[:120]!r}")
    cls = _REGISTRY.get(raw.pop("type"))
    if cls is None:
        raise ProtocolError(f"unknown message type in {line[:120]!r}")
    return from_dict(cls, raw)


def message_class(tag: str) -> type[Message]:
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise ProtocolError(f"unknown message type {tag!r}")
    return cls


# How each field of a message class is decoded, worked out once per class (the console decodes
# hundreds of thousands of messages a second: dataclasses.fields() per message was its top cost).
_PLAIN, _TUPLE, _SPECS = 0, 1, 2
_FIELDS: dict[type, tuple[tuple[str, int], ...]] = {}


def _field_kinds(cls: type) -> tuple[tuple[str, int], ...]:
    kinds = _FIELDS.get(cls)
    if kinds is None:
        out = []
        for f in dataclasses.fields(cls):
            hint = str(f.type)
            if hint.startswith(("tuple[ProcSpec", "Tuple[ProcSpec")):
                out.append((f.name, _SPECS))
            elif hint.lower().startswith("tuple"):
                out.append((f.name, _TUPLE))
            else:
                out.append((f.name, _PLAIN))
        kinds = _FIELDS[cls] = tuple(out)
    return kinds


def from_dict(cls: type[Message], raw: dict[str, Any]) -> Message:
    kwargs: dict[str, Any] = {}
    for name, kind in _field_kinds(cls):
        if name not in raw:
            continue
        value = raw[name]
        if kind == _SPECS:
            value = tuple(ProcSpec(**{**v, "argv": tuple(v["argv"])}) for v in value)
        elif kind == _TUPLE and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(f"bad {cls.type} message: {exc}") from exc


# ---------------------------------------------------------------- console -> agent


@dataclass(frozen=True)
class ProcSpec:
    """One process the agent launches: a rank, or the MindSpore scheduler."""

    name: str  # "r3" or "sched"
    rank: int  # global rank; SCHEDULER_RANK for the scheduler
    local_rank: int
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def is_scheduler(self) -> bool:
        return is_scheduler(self.rank)


@dataclass(frozen=True)
class Start(Message):
    type: ClassVar[str] = "start"
    run_id: str
    node: str
    attempt: int
    run_dir: str  # per run and node: logs and metrics land here and persist
    cwd: str  # where the ranks run
    procs: tuple[ProcSpec, ...]
    grace_s: float  # TERM -> KILL; always said (inventory stop.grace_s), so the agent keeps no default
    workdir_archive: str | None = None  # a tar.gz the agent unpacks into cwd first
    flush_interval_s: float = 0.1
    spares: bool = False  # a restart may follow: once past start-up, prepare the next attempt's ranks
    join_standby: bool = False  # the spares also join their own cluster ahead (StandbyState, standby_port)
    warm: bool = False  # this attempt runs on the standby cluster its spares joined (every node's is ready)
    metrics_pattern: str | None = None  # a user regex for loss lines (named groups step, loss, epoch)
    watchdog_s: float = 0.0  # no word from the console this long (a partition): stop the ranks, exit
    keep_runs: int | None = None  # older runs of this node kept as it starts (None: retention.KEEP_RUNS)
    drop_kept: bool = False  # a cold attempt 0 ends the standby an earlier run kept (Adopt) on the node


@dataclass(frozen=True)
class Ping(Message):
    """The console is still there (the agent's watchdog; SSH keepalives only protect the console)."""

    type: ClassVar[str] = "ping"


@dataclass(frozen=True)
class Inspect(Message):
    """The console saw no progress from these processes: report their state and stack (ProcHung)."""

    type: ClassVar[str] = "inspect"
    names: tuple[str, ...] = ()
    reason: str = ""  # why, with the limit that fired: it becomes the ProcHung's ``why``
    silent_s: float = 0.0  # the limit they passed on the console's clock: the agent checks its own


@dataclass(frozen=True)
class Resolve(Message):
    """Resolve a host name to an IP address as this node sees it (MS_SCHED_HOST must be an IP)."""

    type: ClassVar[str] = "resolve"
    host: str = ""


@dataclass(frozen=True)
class Stop(Message):
    """Stop every process: TERM to each process group, one shared deadline, then KILL."""

    type: ClassVar[str] = "stop"
    reason: str
    grace_s: float


@dataclass(frozen=True)
class Subscribe(Message):
    """What the console's views need of a node (issue 44): the log lines of ``ranks`` (global rank
    ids; ``all_ranks``: every rank's) and, every ``tick_s``, a NodeSummary of each rank's latest
    metric and counts. Every line stays in the node's log files either way (fetched at the end).

    Until its first Subscribe an agent streams every line and every metric (MetricBatch), as
    before version 9: a console that never subscribes (an attach, a test) sees all of it."""

    type: ClassVar[str] = "subscribe"
    ranks: tuple[int, ...] = ()
    all_ranks: bool = False
    tick_s: float = 1.0
    # True: every metric still goes as a MetricBatch each flush (a small run: its charts and the
    # straggler watch, which compares ranks step by step, see every step); the NodeSummary then
    # carries the counts. False: the latest metric of each rank, in the NodeSummary.
    every_metric: bool = False

    def wants(self, rank: int) -> bool:
        return self.all_ranks or rank in self.ranks


@dataclass(frozen=True)
class Shutdown(Message):
    """Stop everything (if still running) and exit; ``keep_warm_s``: first leave a joined standby
    for the next run of the job, kept that long (agent/keeper.py)."""

    type: ClassVar[str] = "shutdown"
    keep_warm_s: float = 0.0


@dataclass(frozen=True)
class Adopt(Message):
    """Before attempt 0: take the standby a run of this job kept on the node, if it fits this
    attempt's processes (answered by a StandbyState for attempt 0; a misfit is dropped)."""

    type: ClassVar[str] = "adopt"
    run_dir: str
    cwd: str
    procs: tuple[ProcSpec, ...]


# ---------------------------------------------------------------- agent -> console


@dataclass(frozen=True)
class Hello(Message):
    type: ClassVar[str] = "hello"
    node: str
    protocol: int
    pid: int
    hostname: str
    python: str
    platform: str
    ssh_addr: str | None = None  # the server address of SSH_CONNECTION: how the console reached us


@dataclass(frozen=True)
class ProcStarted(Message):
    type: ClassVar[str] = "proc_started"
    journaled: ClassVar[bool] = True
    reported: ClassVar[bool] = True
    node: str
    name: str
    rank: int
    pid: int
    ts_ns: int
    log_path: str


@dataclass(frozen=True)
class LogBatch(Message):
    """Consecutive whole lines of one process; ``seq`` numbers the first (0-based, per process)."""

    type: ClassVar[str] = "log"
    streamed: ClassVar[bool] = True
    node: str
    name: str
    rank: int
    seq: int
    lines: tuple[str, ...]
    ts_ns: int


@dataclass(frozen=True)
class Metric(Message):
    type: ClassVar[str] = "metric"
    streamed: ClassVar[bool] = True
    sampled: ClassVar[bool] = True
    node: str
    name: str
    rank: int
    step: int
    loss: float | None = None
    epoch: int | None = None
    step_time_s: float | None = None
    samples_per_s: float | None = None
    ts: float = 0.0
    source: str = "parsed"  # "parsed" from LossMonitor lines, or "metrics" from MSCON_METRICS
    loss_scale: float | None = None
    overflow: bool | None = None
    device_memory_bytes: int | None = None
    checksum: str | None = None  # digest of the replicated parameters (data parallel)
    profile_dir: str | None = None  # where a profiler window was written
    # The rank's clock when it began the step with its batch in hand. In a data-parallel job every
    # rank's step ends in the same AllReduce, so their step times are equal; how much later than
    # the others a rank arrives is what it costs them (console/engine/stragglers.py).
    arrive_ts: float | None = None


@dataclass(frozen=True)
class Telemetry(Message):
    type: ClassVar[str] = "telemetry"
    streamed: ClassVar[bool] = True
    sampled: ClassVar[bool] = True
    node: str
    name: str
    rank: int
    cpu_percent: float | None
    rss_bytes: int | None
    ts: float
    device_util: float | None = None  # percent, from nvidia-smi where the node has it
    device_mem_bytes: int | None = None  # used on this rank's device (DEVICE_ID)
    device_mem_total: int | None = None


@dataclass(frozen=True)
class ProcExited(Message):
    type: ClassVar[str] = "proc_exited"
    alarm: ClassVar[bool] = True
    journaled: ClassVar[bool] = True
    reported: ClassVar[bool] = True
    off_link: ClassVar[tuple[str, ...]] = ("tail", "traceback")
    node: str
    name: str
    rank: int
    pid: int
    exitcode: int | None  # None when killed by a signal
    signal: str | None  # e.g. "SIGKILL"
    signum: int | None
    ts_ns: int
    stopped_by_agent: bool  # True when the agent had already sent it TERM/KILL
    tail: tuple[str, ...] = ()
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return self.exitcode == 0

    @property
    def shell_code(self) -> int:
        """The code a shell would report: 128 + signal number for a signal."""
        if self.signum is not None:
            return 128 + self.signum
        return self.exitcode if self.exitcode is not None else 1

    def describe(self, short: bool = False) -> str:
        """How it ended, in words: "killed by SIGKILL" / "exit code 7" (``short``: "SIGKILL" /
        "exit 7", for tables). Every view and the summary say it this way."""
        if self.signal:
            return self.signal if short else "killed by %s" % self.signal
        return ("exit %s" if short else "exit code %s") % self.exitcode


@dataclass(frozen=True)
class AllExited(Message):
    """Every process of the node has exited and its logs are flushed."""

    type: ClassVar[str] = "all_exited"
    journaled: ClassVar[bool] = True
    reported: ClassVar[bool] = True
    node: str
    ts_ns: int


@dataclass(frozen=True)
class AgentError(Message):
    type: ClassVar[str] = "agent_error"
    alarm: ClassVar[bool] = True
    journaled: ClassVar[bool] = True
    reported: ClassVar[bool] = True
    node: str
    message: str


@dataclass(frozen=True)
class ProcHung(Message):
    """A process that makes no progress: stopped by a signal (state T), or silent when asked (Inspect)."""

    type: ClassVar[str] = "proc_hung"
    alarm: ClassVar[bool] = True
    journaled: ClassVar[bool] = True
    reported: ClassVar[bool] = True
    off_link: ClassVar[tuple[str, ...]] = ("stack", "tail", "wchan")
    node: str
    name: str
    rank: int
    pid: int
    why: str  # "stopped" (state T, reported unasked) or "no progress" (answer to Inspect)
    state: str  # /proc state letter and its meaning, e.g. "T (stopped)"
    since_ns: int  # last progress (a log line or a metric) by this agent's clock
    ts_ns: int
    wchan: str = ""
    stack: str = ""  # py-spy dump where py-spy is installed on the node, else empty
    tail: tuple[str, ...] = ()


@dataclass(frozen=True)
class Evidence(Message):
    """A line in which MindSpore itself names ranks that stopped responding (scheduler, HCCL)."""

    type: ClassVar[str] = "evidence"
    alarm: ClassVar[bool] = True
    journaled: ClassVar[bool] = True
    node: str
    name: str  # the process whose log held the line (the witness)
    rank: int
    ranks: tuple[int, ...]  # the ranks it names
    kind: str  # e.g. "first_timed_out", "timed_out", "remote_rank"
    text: str
    ts_ns: int


class Milestone:
    """A rank's start-up milestones (``RankPhase.phase``; plain strings on the wire)."""

    IMPORTED = "imported"  # the script imported MindSpore
    JOINED = "joined"  # MindSpore's cluster init() returned
    READY = "ready"  # model and data built: the first step begins
    COMPILED = "compiled"  # the first step returned (its graphs compiled and ran once)
    FIRST_STEP = "first_step"  # the agent read the rank's first metric (any script)
    # What a rank may write to MSCON_METRICS as {"phase": NAME, "ts": seconds}; FIRST_STEP is the agent's.
    RECORDED = (IMPORTED, JOINED, READY, COMPILED)


class GraphSource:
    """Where a rank's first step got its graph (``RankPhase.graph``, with COMPILED; plain strings on
    the wire): from the run's compile cache on the node, or compiled (mscon_resume/compile_cache.py)."""

    LOADED = "loaded"
    COMPILED = "compiled"
    ALL = (LOADED, COMPILED)


@dataclass(frozen=True)
class RankPhase(Message):
    """A rank reached a start-up milestone (``Milestone``) at ``ts_ns``, by its own node's clock;
    ``graph`` (``GraphSource``, COMPILED only): whether its first step loaded its graph or compiled
    it (None: not said)."""

    type: ClassVar[str] = "rank_phase"
    journaled: ClassVar[bool] = True  # an attaching console's start-up breakdown comes from the journal
    reported: ClassVar[bool] = True  # a coordinator's policy learns the attempt got past start-up
    node: str
    name: str
    rank: int
    phase: str
    ts_ns: int
    graph: str | None = None


class ResumeSource:
    """Where a rank's state came from as it started (``RankResumed.source``; plain strings on the
    wire): the resume record a rank writes to MSCON_METRICS once per attempt, before its first step
    (``{"resume": {"step": 150, "epoch": 3, "source": "snapshot"}, "ts": 1700000000.5}``)."""

    SNAPSHOT = "snapshot"  # a state copy in node memory
    CHECKPOINT = "checkpoint"  # a durable checkpoint
    NONE = "none"  # nothing every rank had: it starts at step 0
    # it could not restore a state exactly: it exits (code 65) before its first step, saying why
    # (``{"resume": {"step": 0, "source": "refused", "reason": "..."}, ...}``)
    REFUSED = "refused"
    ALL = (SNAPSHOT, CHECKPOINT, NONE, REFUSED)


RESUME_REASON_MAX = 300  # characters of a refusal's reason kept (agent/metrics.py cuts it to one line)


@dataclass(frozen=True)
class RankResumed(Message):
    """A rank said where it starts: after global step ``step`` (its first step is ``step`` + 1), in
    0-based epoch ``epoch`` (None: not said), from ``source`` (``ResumeSource``); or that it
    refused to resume (``ResumeSource.REFUSED``, step 0), and why: ``reason``, the rank's own words
    on one line, at most ``RESUME_REASON_MAX`` characters (None: not said, or not a refusal)."""

    type: ClassVar[str] = "rank_resumed"
    journaled: ClassVar[bool] = True  # an attaching console's summary says where each attempt resumed
    node: str
    name: str
    rank: int
    step: int
    source: str
    epoch: int | None = None
    ts_ns: int = 0
    reason: str | None = None


def standby_port(base: int, attempt: int) -> int:
    """The scheduler port of attempt ``attempt``'s standby cluster (joined during the attempt before
    it, while that one holds ``base`` or the other standby port): the two alternate above ``base``,
    so a standby never meets the cluster it stands by for, nor a cold attempt (on ``base``)."""
    return base + 1 + attempt % 2


def on_standby(spec: ProcSpec, attempt: int) -> ProcSpec:
    """``spec`` as it runs in attempt ``attempt``'s standby cluster: its scheduler port moved."""
    base = spec.env.get("MS_SCHED_PORT", "")
    if not base.isdigit():
        return spec
    return dataclasses.replace(spec, env=dict(spec.env, MS_SCHED_PORT=str(standby_port(int(base), attempt))))


class StandbyPhase(str, enum.Enum):
    """Where a node's spares for an attempt are (``StandbyState.state``; its value on the wire)."""

    JOINING = "joining"  # started: importing MindSpore and joining their standby cluster
    READY = "ready"  # every one has joined (the scheduler's is alive)
    LOST = "lost"  # one is gone: the standby is of no use (all or nothing)

    def __str__(self) -> str:  # the value, as StrEnum prints (the agent's Python may be 3.8)
        return str(self.value)


def standby_phase(value: object) -> StandbyPhase:
    """A standby state as given: its word (the wire's), or a bool (ready, else lost: what a
    standby's word was before it could be joining). TypeError for anything else (a bad message)."""
    if isinstance(value, bool):
        return StandbyPhase.READY if value else StandbyPhase.LOST
    try:
        return StandbyPhase(value)
    except ValueError:
        words = ", ".join(p.value for p in StandbyPhase)
        raise TypeError("state %r is none of %s" % (value, words)) from None


@dataclass(frozen=True)
class StandbyState(Message):
    """Where this node's spares for ``attempt`` are: joining their standby cluster, all joined
    (ready), or one of them gone (lost, ``why``). The policy starts that attempt warm only when every
    node's are ready; when every node's are at least joining, a restart may wait for them."""

    type: ClassVar[str] = "standby_state"
    reported: ClassVar[bool] = True
    journaled: ClassVar[bool] = True
    node: str
    attempt: int
    state: StandbyPhase
    why: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", standby_phase(self.state))

    @property
    def ready(self) -> bool:
        return self.state is StandbyPhase.READY

    @property
    def joining(self) -> bool:
        return self.state is StandbyPhase.JOINING


@dataclass(frozen=True)
class Resolved(Message):
    type: ClassVar[str] = "resolved"
    node: str
    host: str
    address: str | None = None  # an IPv4 address where there is one, else IPv6
    error: str | None = None


# ---------------------------------------------------------------- detach and attach


class Role:
    """What a detached agent does besides its own node (plain strings on the wire)."""

    COORDINATOR = "coordinator"  # node 0: carries the run's policy while no console is attached
    FOLLOWER = "follower"  # reports to the coordinator, takes its Stop and Start


class CoordKind:
    """What the coordinator decided (``Coord.kind``)."""

    STOPPING = "stopping"
    NODE_LOST = "node_lost"  # a follower's link ended or went silent (trigger: the node)
    ATTEMPT_ENDED = "attempt_ended"
    RESTARTING = "restarting"
    AWAITING_OPERATOR = "awaiting_operator"  # failed with no budget: mscon attach, then r restarts
    ATTEMPT_STARTED = "attempt_started"
    RUN_ENDED = "run_ended"


@dataclass(frozen=True)
class Detach(Message):
    """Keep the run going without the console: become a daemon reachable on a Unix socket in the
    run folder. Every node gets its own Start for a next attempt (``next_start``, Start.to_dict();
    the coordinator's link carries only "start attempt N", never argv or env); the coordinator also
    gets what the policy needs: the nodes, the workers, the restarts left, the backoff and how long
    a failed run waits for an operator."""

    type: ClassVar[str] = "detach"
    role: str = Role.FOLLOWER
    secret: str = ""  # authenticates followers to the coordinator (HMAC; never sent back)
    # The run's TLS certificate and key (PEM) for the coordinator's link: every end presents them and
    # accepts only them (agent/tls.py). Secret like ``secret``: over SSH stdin only, never sent back.
    tls_cert: str = ""
    tls_key: str = ""
    coordinator_host: str = ""  # where the coordinator listens (followers dial it, it binds it)
    coordinator_port: int = 0
    nodes: tuple[str, ...] = ()  # coordinator: every node of the run, itself first
    restarts_left: int = 0
    backoff_s: float = 0.0
    hang_timeout_s: float = 0.0  # no line or metric this long: the agent reports the rank hung
    next_start: dict = field(default_factory=dict)
    workers: dict = field(default_factory=dict)  # coordinator: worker name -> its node
    operator_wait_s: float = 0.0  # coordinator: 0 ends a failed run with no budget at once
    standby_ready: tuple[str, ...] = ()  # coordinator: nodes whose standby for the next attempt is ready
    console: str = ""  # who detached (user@host pid), for `mscon ls` and a refused second attach
    keep_warm_s: float = 0.0  # a run that ends by itself leaves a standby for the next (Shutdown's)


@dataclass(frozen=True)
class Detached(Message):
    type: ClassVar[str] = "detached"
    node: str
    socket: str = ""
    coordinator_port: int = 0
    error: str = ""


@dataclass(frozen=True)
class Attach(Message):
    """First message of a console on a detached agent's socket: replay the journal from entry
    ``journal_from``, then each rank's log of the current attempt from line ``log_from[name]``,
    then go live. ``follow`` False: end after the replay (``mscon logs``)."""

    type: ClassVar[str] = "attach"
    journal_from: int = 0
    log_from: dict = field(default_factory=dict)  # process name -> first line wanted, in log_attempt
    log_attempt: int = -1  # the attempt log_from counts in; logs of later attempts come whole
    read_only: bool = False
    follow: bool = True
    console: str = ""


@dataclass(frozen=True)
class Journaled(Message):
    """One journal entry: an agent message of attempt ``attempt``, as it was sent (a dict)."""

    type: ClassVar[str] = "journaled"
    node: str
    index: int
    attempt: int
    msg: dict = field(default_factory=dict)


@dataclass(frozen=True)
class JournalDone(Message):
    """The journal replay is complete; ``attempt`` is the node's current attempt, ``live`` whether an
    agent still runs there (False: the run ended and this is read from its files)."""

    type: ClassVar[str] = "journal_done"
    node: str
    entries: int
    attempt: int
    live: bool = True


@dataclass(frozen=True)
class ReplayDone(Message):
    """Every log line up to now has been replayed; what follows is live."""

    type: ClassVar[str] = "replay_done"
    node: str


@dataclass(frozen=True)
class Coord(Message):
    """A decision of the coordinator of a detached run (``CoordKind``); journaled on node 0."""

    type: ClassVar[str] = "coord"
    journaled: ClassVar[bool] = True
    node: str
    kind: str
    attempt: int
    reason: str = ""
    trigger: str | None = None  # the process (or node) that caused a stop
    outcome: str = ""  # ATTEMPT_ENDED: succeeded | failed | interrupted | restart; RUN_ENDED: the status
    backoff_s: float = 0.0
    restarts_left: int = 0
    ts_ns: int = 0
    wait_s: float = 0.0  # AWAITING_OPERATOR: how long the run waits for `r` before it ends
    warm: bool = False  # ATTEMPT_STARTED: on the standby cluster (StartAttempt.warm)


# ---------------------------------------------------------------- the coordinator link
# Between a detached run's coordinator (node 0) and its followers, signed by agent/detached/coord.py.


@dataclass(frozen=True)
class LinkStatus(Message):
    """A follower's first line: how its attempt stood when the run detached."""

    type: ClassVar[str] = "link_status"
    started: tuple[str, ...] = ()
    ok: tuple[str, ...] = ()  # workers that already exited 0
    all_exited: bool = False


@dataclass(frozen=True)
class LinkPing(Message):
    type: ClassVar[str] = "link_ping"


@dataclass(frozen=True)
class LinkProgress(Message):
    """A follower's live workers as its agent reads them, for the coordinator's hang rule (the
    policy's, as on a console): rank -> [its progress stamp (this node's clock: a new one is new
    progress), seconds since then, its step pace (``HangRule.pace``) or None]."""

    type: ClassVar[str] = "link_progress"
    attempt: int = 0
    ranks: dict = field(default_factory=dict)


@dataclass(frozen=True)
class LinkStop(Message):
    type: ClassVar[str] = "link_stop"
    reason: str
    grace_s: float


@dataclass(frozen=True)
class LinkStart(Message):
    """Start attempt ``attempt`` from the Start this follower got with its Detach."""

    type: ClassVar[str] = "link_start"
    attempt: int
    warm: bool = False  # Start.warm


@dataclass(frozen=True)
class LinkEnd(Message):
    type: ClassVar[str] = "link_end"
    status: str  # policy.Status
    reason: str = ""


@dataclass(frozen=True)
class RunInfo(Message):
    """One run this node holds (``mscon ls``), read from its state.json."""

    type: ClassVar[str] = "run_info"
    node: str
    run_id: str
    status: str  # journal.RunStatus
    attempt: int = 0
    started: float | None = None
    updated: float | None = None
    detached: bool = False
    live: bool = False
    reason: str = ""


@dataclass(frozen=True)
class PrunedRun(Message):
    """One run folder ``mscon prune`` removed from this node (``dry_run``: would remove)."""

    type: ClassVar[str] = "pruned_run"
    node: str
    run_id: str
    bytes: int = 0
    dry_run: bool = False
    error: str = ""  # why it could not be removed; "" where it was


@dataclass(frozen=True)
class RunCommand(Message):
    """An attached console's command for the coordinator: ``stop`` or ``restart``."""

    type: ClassVar[str] = "run_command"
    action: str = "stop"
    reason: str = ""


# ---------------------------------------------------------------- preflight


@dataclass(frozen=True)
class RunChecks(Message):
    """Run these node checks (agent/checks/ names) with these parameters; answered by one
    CheckResult per check (a check may report several) and then ChecksDone."""

    type: ClassVar[str] = "run_checks"
    names: tuple[str, ...] = ()
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CheckResult(Message):
    type: ClassVar[str] = "check_result"
    node: str
    name: str  # e.g. "shm", "mindspore", "gpu.count"
    status: str  # "ok" | "warn" | "fail" | "n/a"
    value: str = ""  # what was measured, short: "64 MiB free of 64 MiB"
    remedy: str = ""  # one line: what to do about a warn or fail
    detail: str = ""


@dataclass(frozen=True)
class ChecksDone(Message):
    type: ClassVar[str] = "checks_done"
    node: str


# ---------------------------------------------------------------- preflight: the TCP mesh test


@dataclass(frozen=True)
class MeshListen(Message):
    """Listen on an ephemeral TCP port of ``host`` (the address the peers dial, as this node
    resolves it; never all addresses), answered by MeshListening. ``token`` is the mesh's secret
    (never on the network): only a caller proving it is answered, with this node's name and the
    listener's own proof, so a peer can tell it reached this node and not another host that happens
    to hold the address (a loopback scheduler address on a real cluster)."""

    type: ClassVar[str] = "mesh_listen"
    token: str = ""
    host: str = ""
    timeout_s: float = 60.0  # the listener closes itself after this long, MeshClose or not
    avoid_port: int = 0  # the scheduler's port: never the listener's, though ephemeral ports may hit it


@dataclass(frozen=True)
class MeshListening(Message):
    type: ClassVar[str] = "mesh_listening"
    node: str
    port: int = 0
    error: str = ""


@dataclass(frozen=True)
class MeshProbe(Message):
    """Connect to each peer's listener; ``peers`` holds {"name", "host", "port"} mappings.
    Answered by MeshResult."""

    type: ClassVar[str] = "mesh_probe"
    peers: tuple[dict, ...] = ()
    token: str = ""
    timeout_s: float = 3.0


@dataclass(frozen=True)
class MeshResult(Message):
    """One mapping per peer: {"name", "host", "port", "ok", "rtt_ms" (the TCP connect), "error"}."""

    type: ClassVar[str] = "mesh_result"
    node: str
    results: tuple[dict, ...] = ()


@dataclass(frozen=True)
class MeshClose(Message):
    type: ClassVar[str] = "mesh_close"


# ---------------------------------------------------------------- batches (scale)

# The layouts of the batch items, read off Metric and Telemetry so a field added there travels in
# batches too. Node (and name and rank for metrics) go once per batch, not per item.
_METRIC_PER_BATCH = ("node", "name", "rank")
# Metric fields every MetricBatch item carries (step), and those it leaves out while they hold
# their default (most do, most steps).
_METRIC_REQUIRED = tuple(
    f.name
    for f in dataclasses.fields(Metric)
    if f.default is dataclasses.MISSING and f.name not in _METRIC_PER_BATCH
)
_METRIC_DEFAULTS = tuple(
    (f.name, f.default) for f in dataclasses.fields(Metric) if f.default is not dataclasses.MISSING
)
_METRIC_ITEM_KEYS = frozenset(_METRIC_REQUIRED + tuple(key for key, _ in _METRIC_DEFAULTS))
_ITEM_NEEDS = frozenset(_METRIC_REQUIRED)


@dataclass(frozen=True)
class MetricBatch(Message):
    """Consecutive metrics of one process, oldest first: one message per flush, not one per step.

    On the wire each item is a compact mapping (``step`` plus the fields that differ from their
    default; node, name and rank once for the batch); decoded, ``metrics`` holds whole ``Metric``
    messages, so consumers handle each one as they would a Metric on its own.
    """

    type: ClassVar[str] = "metrics"
    streamed: ClassVar[bool] = True
    sampled: ClassVar[bool] = True
    node: str
    name: str
    rank: int
    metrics: tuple = ()  # Metric each, with this batch's node, name and rank

    def __post_init__(self) -> None:
        items = self.metrics
        if isinstance(items, list):  # as decoded
            object.__setattr__(self, "metrics", tuple(items))
        if all(isinstance(m, Metric) for m in items):
            for m in items:  # the wire carries node, name and rank once: they must be the batch's
                if (m.node, m.name, m.rank) != (self.node, self.name, self.rank):
                    raise ValueError("a MetricBatch of %s holds a metric of %s" % (self.name, m.name))
        else:  # as decoded: compact mappings
            # Metric.__init__ sets 16 frozen fields one by one; this is the same object built
            # from a filled-in __dict__, several times faster (thousands of metrics a second).
            base = dict(_METRIC_DEFAULTS)
            base["node"], base["name"], base["rank"] = self.node, self.name, self.rank
            built = []
            for d in items:
                if not (isinstance(d, dict) and d.keys() >= _ITEM_NEEDS and _METRIC_ITEM_KEYS.issuperset(d)):
                    raise ProtocolError("bad metrics item: %.120r" % (d,))
                m = object.__new__(Metric)
                m.__dict__.update(base)
                m.__dict__.update(d)
                built.append(m)
            object.__setattr__(self, "metrics", tuple(built))

    def to_dict(self) -> dict[str, Any]:
        items = []
        for m in self.metrics:
            d: dict[str, Any] = {key: getattr(m, key) for key in _METRIC_REQUIRED}
            for key, default in _METRIC_DEFAULTS:
                value = getattr(m, key)
                if value != default:
                    d[key] = value
            items.append(d)
        return {"type": self.type, "node": self.node, "name": self.name, "rank": self.rank, "metrics": items}


_TELEMETRY_FIELDS = tuple(f.name for f in dataclasses.fields(Telemetry) if f.name != "node")


@dataclass(frozen=True)
class TelemetryBatch(Message):
    """Every live process's Telemetry of one node in one message (once a second), in the order sampled.

    On the wire each item is a list of the values of ``_TELEMETRY_FIELDS``; decoded, ``items`` holds
    whole ``Telemetry`` messages.
    """

    type: ClassVar[str] = "telemetry_batch"
    streamed: ClassVar[bool] = True
    sampled: ClassVar[bool] = True
    node: str
    items: tuple = ()  # Telemetry each, with this batch's node

    def __post_init__(self) -> None:
        items = self.items
        if not all(isinstance(t, Telemetry) for t in items):  # as decoded: rows of values
            node = self.node
            built = []
            for row in items:
                if not isinstance(row, list) or len(row) != len(_TELEMETRY_FIELDS):
                    raise ProtocolError("bad telemetry item: expected %d values" % len(_TELEMETRY_FIELDS))
                t = object.__new__(Telemetry)  # as MetricBatch: no field-by-field frozen __init__
                t.__dict__.update(zip(_TELEMETRY_FIELDS, row))
                t.__dict__["node"] = node
                built.append(t)
            object.__setattr__(self, "items", tuple(built))

    def to_dict(self) -> dict[str, Any]:
        rows = [[getattr(t, f) for f in _TELEMETRY_FIELDS] for t in self.items]
        return {"type": self.type, "node": self.node, "items": rows}


# Per rank of a NodeSummary: its name, global rank, lines its log has had (on the node), metrics read.
_COUNT_FIELDS = ("name", "rank", "lines", "steps")


@dataclass(frozen=True)
class RankCount:
    """How far one rank has got, by the node's count: ``lines`` of its log read (every one kept in
    its file), ``steps`` metrics read."""

    name: str
    rank: int
    lines: int
    steps: int


@dataclass(frozen=True)
class NodeSummary(Message):
    """A subscribed agent's word every ``Subscribe.tick_s``: what the console's views show of each
    rank of the node, in one message (the console's cost is per node and tick, not per line).

    ``counts``: every watched rank's RankCount. ``metrics``: the latest Metric of each rank that
    stepped since the last summary (and any with a profiler folder, which a view names). On the wire
    each count is a list of ``_COUNT_FIELDS`` values and each metric a compact mapping, as a
    MetricBatch item with its name and rank."""

    type: ClassVar[str] = "summary"
    streamed: ClassVar[bool] = True
    sampled: ClassVar[bool] = True
    node: str
    ts: float = 0.0
    counts: tuple = ()  # RankCount each
    metrics: tuple = ()  # Metric each, of this node

    def __post_init__(self) -> None:
        counts = self.counts
        if not all(isinstance(c, RankCount) for c in counts):  # as decoded: rows of values
            built = []
            for row in counts:
                if not isinstance(row, list) or len(row) != len(_COUNT_FIELDS):
                    raise ProtocolError("bad summary count: expected %d values" % len(_COUNT_FIELDS))
                c = object.__new__(RankCount)  # as MetricBatch: no field-by-field frozen __init__
                c.__dict__.update(zip(_COUNT_FIELDS, row))
                built.append(c)
            object.__setattr__(self, "counts", tuple(built))
        items = self.metrics
        if not all(isinstance(m, Metric) for m in items):  # as decoded: compact mappings
            base = dict(_METRIC_DEFAULTS)
            base["node"] = self.node
            built_m = []
            for d in items:
                if not (
                    isinstance(d, dict) and d.keys() >= _SUMMARY_NEEDS and _SUMMARY_ITEM_KEYS.issuperset(d)
                ):
                    raise ProtocolError("bad summary metric: %.120r" % (d,))
                m = object.__new__(Metric)  # as MetricBatch: no field-by-field frozen __init__
                m.__dict__.update(base)
                m.__dict__.update(d)
                built_m.append(m)
            object.__setattr__(self, "metrics", tuple(built_m))
        elif isinstance(items, list):
            object.__setattr__(self, "metrics", tuple(items))

    def to_dict(self) -> dict[str, Any]:
        items = []
        for m in self.metrics:
            d: dict[str, Any] = {"name": m.name, "rank": m.rank}
            d.update({key: getattr(m, key) for key in _METRIC_REQUIRED})
            for key, default in _METRIC_DEFAULTS:
                value = getattr(m, key)
                if value != default:
                    d[key] = value
            items.append(d)
        rows = [[c.name, c.rank, c.lines, c.steps] for c in self.counts]
        return {"type": self.type, "node": self.node, "ts": self.ts, "counts": rows, "metrics": items}


_SUMMARY_NEEDS = frozenset(_METRIC_REQUIRED + ("name", "rank"))
_SUMMARY_ITEM_KEYS = _METRIC_ITEM_KEYS | {"name", "rank"}
