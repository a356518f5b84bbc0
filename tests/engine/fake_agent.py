"""An in-process agent double: the supervisor's policy, tested in milliseconds.

``FakeCluster`` is the ``transport_factory`` handed to ``Supervisor``: every call makes a
``FakeTransport`` for one node, whose ``start_agent`` returns a ``FakeChannel``. No SSH, no
subprocess. The channel speaks the real wire protocol (each message is encoded and decoded as
on a real channel) and runs a small scripted node:

- ``Start``: a ``ProcStarted`` for every ProcSpec, then each rank plays its SCRIPT (a list of
  timed actions, see below; a rank without one lives, silently, until it is stopped);
- ``Stop``: every live process is reported as ``ProcExited(stopped_by_agent=True, SIGTERM)``,
  then ``AllExited`` (after ``NodeConfig.stop_delay_s``; never with ``on_stop="ignore"``);
- every process of the node exited on its own: ``AllExited``;
- ``Inspect(names)``: ``ProcHung(why="no progress")`` for each named live process;
- ``Resolve(host)``: ``Resolved`` from ``FakeCluster.resolve``;
- ``Shutdown`` or ``close()``: the channel ends (``recv`` returns None);
- ``lose()``: the channel ends at once, with nothing more delivered (a lost node).

Script actions take ``at``, seconds after the node received its ``Start``. The timestamps a
fake agent puts in its messages are its own clock: ``time.time_ns()`` at that ``Start`` plus
``ts`` seconds (``ts`` defaults to ``at``), so a test can make a failure happen earlier by the
agents' clocks than it arrives.

Every message the console sent is recorded with ``time.monotonic()`` (``FakeCluster.sent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import os
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mscon.agent import layout
from mscon.agent.protocol import (
    PROTOCOL_VERSION,
    AgentError,
    AllExited,
    Evidence,
    Hello,
    Inspect,
    LogBatch,
    Message,
    Metric,
    ProcExited,
    ProcHung,
    ProcSpec,
    ProcStarted,
    RankResumed,
    Resolve,
    Resolved,
    Shutdown,
    StandbyPhase,
    StandbyState,
    Start,
    Stop,
    decode,
    encode,
)
from mscon.console.config.inventory import Inventory, NodeSpec
from mscon.console.transport import AgentChannel, NodeTransport, NodeUnreachable, SshOptions, TransportKind
from mscon.console.transport.bundle import AgentBundle, WorkdirArchive

_SIGNUMS = {"SIGHUP": 1, "SIGINT": 2, "SIGABRT": 6, "SIGKILL": 9, "SIGSEGV": 11, "SIGPIPE": 13, "SIGTERM": 15}

# ------------------------------------------------------------------ script actions


@dataclass(frozen=True)
class Log:
    """Log lines (a LogBatch) at ``at`` s."""

    at: float
    lines: tuple[str, ...] = ("working",)


@dataclass(frozen=True)
class LogEvery:
    """A log line every ``period`` s from ``at`` on, until ``until`` (None: until stopped)."""

    at: float
    period: float = 0.05
    until: float | None = None


@dataclass(frozen=True)
class Met:
    """A Metric at ``at`` s."""

    at: float
    step: int
    loss: float | None = 0.5
    checksum: str | None = None


@dataclass(frozen=True)
class Resumed:
    """The rank's resume record (a RankResumed) at ``at`` s: it resumes after ``step`` (or, source
    "refused", refuses to, saying ``reason``)."""

    at: float
    step: int
    source: str = "snapshot"
    epoch: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Exit:
    """The process exits on its own at ``at`` s: ``code``, or killed by ``signal`` (``"SIGKILL"``)."""

    at: float
    code: int = 0
    signal: str | None = None
    ts: float | None = None  # agent clock, seconds after Start (default: ``at``)
    traceback: str | None = None


@dataclass(frozen=True)
class Stopped:
    """The process is stopped by a signal (state T): ProcHung(why="stopped"); it lives until stopped."""

    at: float


@dataclass(frozen=True)
class Blame:
    """MindSpore names ``ranks`` in this process's log (an Evidence line) at ``at`` s."""

    at: float
    ranks: tuple[int, ...]
    kind: str = "first_timed_out"
    text: str = "The node 1 is the first one timed out"


@dataclass(frozen=True)
class Lose:
    """The whole node is lost at ``at`` s (its channel ends at once)."""

    at: float


Action = Log | LogEvery | Met | Resumed | Exit | Stopped | Blame | Lose
Script = Mapping[str, Sequence[Action]]  # rank name ("r0", "sched") -> its actions


def all_exit(names: Sequence[str], at: float = 0.05, code: int = 0) -> dict[str, list[Action]]:
    """Every named rank logs a line and exits with ``code`` at ``at`` s."""
    return {n: [Log(at / 2, (f"{n} done",)), Exit(at, code)] for n in names}


# ------------------------------------------------------------------ configuration and records


@dataclass
class NodeConfig:
    protocol: int = PROTOCOL_VERSION
    hello: bool = True  # False: the agent never says Hello
    ssh_addr: str | None = None  # default: the node's host when it is an IP
    on_stop: Literal["term", "ignore"] = "term"  # "ignore": never confirms a Stop
    stop_delay_s: float = 0.0  # a Stop takes effect this long after it arrives
    stall_after_start_s: float = 0.0  # the console's loop is held this long after a Start (a loaded machine)
    connect_error: str | None = None  # connect() raises NodeUnreachable with this
    resolve_delay_s: float = 0.0  # a Resolve is answered this long after it arrives
    stderr: str = ""
    # A Start with join_standby: the node's standby for the next attempt says this, this long after
    # (None: says nothing); "lost" says a spare is gone.
    standby: Literal["ready", "lost"] | None = None
    standby_after_s: float = 0.02
    standby_joining: bool = False  # it first says its spares are joining, as the agent does


@dataclass(frozen=True)
class Sent:
    """One message the console sent to a node, and when (``time.monotonic()``)."""

    t: float
    node: str
    msg: Message


@dataclass
class _Proc:
    spec: ProcSpec
    pid: int
    progress_ns: int
    alive: bool = True
    hung: bool = False


@dataclass
class FakeCluster:
    """The ``transport_factory``: one FakeTransport per call; everything the fakes saw is kept here."""

    home_root: Path
    script: Script | Callable[[int], Script] = field(default_factory=dict)  # or per attempt
    nodes: dict[str, NodeConfig] = field(default_factory=dict)  # per node name; default NodeConfig()
    resolve: dict[str, str] = field(default_factory=dict)  # host -> address; others fail to resolve
    sent: list[Sent] = field(default_factory=list)
    received: list[tuple[float, str, Message]] = field(default_factory=list)  # what the fakes said
    transports: dict[str, list[FakeTransport]] = field(default_factory=dict)
    fetched: list[tuple[str, str, str]] = field(default_factory=list)  # (node, remote, local)
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    def __call__(self, inv: Inventory, node: NodeSpec, ssh: SshOptions) -> NodeTransport:
        transport = FakeTransport(node, self)
        self.transports.setdefault(node.name, []).append(transport)
        return transport

    def config(self, node: str) -> NodeConfig:
        return self.nodes.setdefault(node, NodeConfig())

    def script_for(self, attempt: int) -> Script:
        return self.script(attempt) if callable(self.script) else self.script

    def channel(self, node: str) -> FakeChannel:
        """The node's latest channel."""
        channel = self.transports[node][-1].channel
        assert channel is not None, f"{node} has no agent"
        return channel

    def factory_calls(self, node: str) -> int:
        return len(self.transports.get(node, []))

    def sent_of(self, kind: type[Message], node: str | None = None) -> list[Sent]:
        return [s for s in self.sent if isinstance(s.msg, kind) and (node is None or s.node == node)]

    def pid(self) -> int:
        return next(self._pids)


# ------------------------------------------------------------------ transport and channel


class FakeTransport(NodeTransport):
    kind = TransportKind.SSH

    def __init__(self, node: NodeSpec, cluster: FakeCluster) -> None:
        super().__init__(node)
        self.cluster = cluster
        self.channel: FakeChannel | None = None
        self.closed = False

    async def connect(self) -> None:
        error = self.cluster.config(self.node.name).connect_error
        if error is not None:
            raise NodeUnreachable(f"{self.node.name}: {error}")
        home = self.cluster.home_root / self.node.name
        home.mkdir(parents=True, exist_ok=True)
        self.home = str(home)

    async def ensure_agent(self, bundle: AgentBundle) -> str:
        return f"{self.cache_root}/{bundle.dirname}"

    async def holds_run(self, run_id: str) -> bool:
        return os.path.lexists(self.run_dir(run_id))  # the fake home is a real folder

    async def upload_workdir(self, archive: WorkdirArchive) -> str:
        return f"{self.cache_root}/workdir.tar.gz"

    async def start_agent(self, agent_dir: str, python: str) -> AgentChannel:
        self.channel = FakeChannel(self.node, self.cluster)
        return self.channel

    async def fetch_run_dir(
        self, remote: str, local: str, logs_root: str | None = None, include: tuple = (), progress: Any = None
    ) -> int:
        self.cluster.fetched.append((self.node.name, remote, local))
        return 0

    async def close(self) -> None:
        self.closed = True

    @property
    def syncs_workdir(self) -> bool:
        return False


class FakeChannel(AgentChannel):
    def __init__(self, node: NodeSpec, cluster: FakeCluster) -> None:
        self.node = node.name
        self.cluster = cluster
        self.cfg = cluster.config(node.name)
        self._out: asyncio.Queue[str] = asyncio.Queue()
        self.ended = False  # closed, shut down or lost: recv returns None from here on
        self.lost = False
        self.sent: list[Sent] = []  # what the console sent on this channel
        self.procs: dict[str, _Proc] = {}
        self.attempt: int | None = None
        self.all_exited_sent = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._start_ns = time.time_ns()
        self._start_mono = time.monotonic()
        if self.cfg.hello:
            addr = self.cfg.ssh_addr if self.cfg.ssh_addr is not None else _ip_or_none(node.host)
            self._emit(
                Hello(
                    node=self.node,
                    protocol=self.cfg.protocol,
                    pid=cluster.pid(),
                    hostname=f"host-{self.node}",
                    python="3.11.0",
                    platform="fake",
                    ssh_addr=addr,
                )
            )

    # -------------------------------------------------------------- AgentChannel

    async def _write(self, data: str) -> None:
        if self.ended:
            raise ConnectionResetError(f"{self.node}: the agent's channel is closed")
        msg = decode(data)  # what a real agent would read
        record = Sent(time.monotonic(), self.node, msg)
        self.sent.append(record)
        self.cluster.sent.append(record)
        self._dispatch(msg)

    async def _readline(self) -> str:
        if self.ended:
            return ""
        line = await self._out.get()
        return "" if self.ended else line

    async def close(self, wait_s: float = 10.0) -> None:
        self._end()

    def _stderr_raw(self) -> str:
        return self.cfg.stderr

    # -------------------------------------------------------------- test controls

    def lose(self) -> None:
        """The node is gone: recv returns None at once; nothing queued is delivered."""
        self.lost = True
        self._end()

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        for proc in self.procs.values():
            proc.alive = False
        for task in list(self._tasks):
            task.cancel()
        while not self._out.empty():
            self._out.get_nowait()
        self._out.put_nowait("")

    # -------------------------------------------------------------- the scripted node

    def _emit(self, msg: Message) -> None:
        if self.ended:
            return
        self.cluster.received.append((time.monotonic(), self.node, msg))
        self._out.put_nowait(encode(msg))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"fake:{self.node}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Start):
            self._start(msg)
        elif isinstance(msg, Stop):
            if self.cfg.on_stop == "term":
                if self.cfg.stop_delay_s > 0:
                    self._spawn(self._stop_later(self.cfg.stop_delay_s), "stop")
                else:
                    self._stop_all()
        elif isinstance(msg, Inspect):
            for name in msg.names:
                proc = self.procs.get(name)
                if proc is not None and proc.alive:
                    self._hung(proc, "no progress", "S (sleeping)")
        elif isinstance(msg, Resolve):
            if self.cfg.resolve_delay_s > 0:
                self._spawn(self._resolve_later(msg.host, self.cfg.resolve_delay_s), "resolve")
            else:
                self._resolve(msg.host)
        elif isinstance(msg, Shutdown):
            self._end()

    def _resolve(self, host: str) -> None:
        address = self.cluster.resolve.get(host)
        if address is None:
            self._emit(Resolved(node=self.node, host=host, error="Name or service not known"))
        else:
            self._emit(Resolved(node=self.node, host=host, address=address))

    async def _resolve_later(self, host: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self._resolve(host)

    def _start(self, cmd: Start) -> None:
        if any(p.alive for p in self.procs.values()):
            self._emit(AgentError(node=self.node, message="start refused: processes still running"))
            return
        self.attempt = cmd.attempt
        self.all_exited_sent = False
        self._start_ns = time.time_ns()
        self._start_mono = time.monotonic()
        self.procs = {}
        script = self.cluster.script_for(cmd.attempt)
        for spec in sorted(cmd.procs, key=lambda s: not s.is_scheduler):
            proc = _Proc(spec, self.cluster.pid(), self._start_ns)
            self.procs[spec.name] = proc
            self._emit(
                ProcStarted(
                    node=self.node,
                    name=spec.name,
                    rank=spec.rank,
                    pid=proc.pid,
                    ts_ns=self._start_ns,
                    log_path=layout.log_path(cmd.run_dir, cmd.attempt, spec.name),
                )
            )
        for name, proc in self.procs.items():
            actions = list(script.get(name, ()))
            if actions:
                self._spawn(self._play(proc, actions), name)
        if cmd.join_standby and self.cfg.standby is not None:
            self._spawn(self._standby(cmd.attempt + 1, self.cfg.standby == "ready"), "standby")
        if self.cfg.stall_after_start_s > 0:
            time.sleep(self.cfg.stall_after_start_s)  # blocks the loop on purpose: a console too busy to read

    async def _standby(self, attempt: int, ready: bool) -> None:
        if self.cfg.standby_joining:
            self._emit(StandbyState(node=self.node, attempt=attempt, state=StandbyPhase.JOINING))
        await self._sleep_until(self.cfg.standby_after_s)
        why = "" if ready else "the spare for r1 exited (SIGKILL)"
        state = StandbyPhase.READY if ready else StandbyPhase.LOST
        self._emit(StandbyState(node=self.node, attempt=attempt, state=state, why=why))

    def _ts(self, seconds: float) -> int:
        return self._start_ns + int(seconds * 1e9)

    async def _sleep_until(self, at: float) -> None:
        # A timer even when ``at`` is past: the loop wakes due timers in time order, so after a
        # stall (a loaded machine) the processes' actions still come in their scripted order. A
        # bare "already due?" test let whichever task ran first go first: r1's exit at 0.1 s before
        # the scheduler's blame line at 0.03 s.
        loop = asyncio.get_running_loop()
        due: asyncio.Future[None] = loop.create_future()
        loop.call_at(self._start_mono + at, lambda: due.done() or due.set_result(None))
        await due

    async def _play(self, proc: _Proc, actions: list[Action]) -> None:
        spec = proc.spec
        seq = 0
        for action in sorted(actions, key=lambda a: a.at):
            await self._sleep_until(action.at)
            if not proc.alive or self.ended:
                return
            if isinstance(action, Log | LogEvery):
                lines = action.lines if isinstance(action, Log) else ("tick",)
                while True:
                    now_ns = self._ts(time.monotonic() - self._start_mono)
                    self._emit(LogBatch(self.node, spec.name, spec.rank, seq, tuple(lines), now_ns))
                    seq += len(lines)
                    proc.progress_ns = now_ns
                    if isinstance(action, Log):
                        break
                    elapsed = time.monotonic() - self._start_mono
                    if action.until is not None and elapsed + action.period > action.until:
                        break
                    await asyncio.sleep(action.period)
                    if not proc.alive or self.ended:
                        return
            elif isinstance(action, Met):
                ts = self._ts(action.at)
                proc.progress_ns = ts
                self._emit(
                    Metric(
                        node=self.node,
                        name=spec.name,
                        rank=spec.rank,
                        step=action.step,
                        loss=action.loss,
                        ts=ts / 1e9,
                        checksum=action.checksum,
                    )
                )
            elif isinstance(action, Resumed):
                self._emit(
                    RankResumed(
                        node=self.node,
                        name=spec.name,
                        rank=spec.rank,
                        step=action.step,
                        source=action.source,
                        epoch=action.epoch,
                        ts_ns=self._ts(action.at),
                        reason=action.reason,
                    )
                )
            elif isinstance(action, Blame):
                self._emit(
                    Evidence(
                        node=self.node,
                        name=spec.name,
                        rank=spec.rank,
                        ranks=action.ranks,
                        kind=action.kind,
                        text=action.text,
                        ts_ns=self._ts(action.at),
                    )
                )
            elif isinstance(action, Stopped):
                self._hung(proc, "stopped", "T (stopped)")
            elif isinstance(action, Lose):
                self.lose()
                return
            elif isinstance(action, Exit):
                signum = _SIGNUMS.get(action.signal, 0) if action.signal else None
                self._exited(
                    proc,
                    exitcode=None if action.signal else action.code,
                    signal=action.signal,
                    signum=signum,
                    ts_ns=self._ts(action.at if action.ts is None else action.ts),
                    by_agent=False,
                    traceback=action.traceback,
                )
                return

    def _hung(self, proc: _Proc, why: str, state: str) -> None:
        proc.hung = True
        spec = proc.spec
        self._emit(
            ProcHung(
                node=self.node,
                name=spec.name,
                rank=spec.rank,
                pid=proc.pid,
                why=why,
                state=state,
                since_ns=proc.progress_ns,
                ts_ns=time.time_ns(),
                wchan="futex_wait_queue",
                tail=("last line",),
            )
        )

    def _exited(
        self,
        proc: _Proc,
        exitcode: int | None,
        signal: str | None,
        signum: int | None,
        ts_ns: int,
        by_agent: bool,
        traceback: str | None = None,
    ) -> None:
        if not proc.alive:
            return
        proc.alive = False
        spec = proc.spec
        self._emit(
            ProcExited(
                node=self.node,
                name=spec.name,
                rank=spec.rank,
                pid=proc.pid,
                exitcode=exitcode,
                signal=signal,
                signum=signum,
                ts_ns=ts_ns,
                stopped_by_agent=by_agent,
                tail=(f"{spec.name} last words",),
                traceback=traceback,
            )
        )
        self._maybe_all_exited()

    def _maybe_all_exited(self) -> None:
        if self.procs and not self.all_exited_sent and not any(p.alive for p in self.procs.values()):
            self.all_exited_sent = True
            self._emit(AllExited(node=self.node, ts_ns=time.time_ns()))

    async def _stop_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._stop_all()

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.alive:
                self._exited(proc, None, "SIGTERM", 15, time.time_ns(), by_agent=True)


def _ip_or_none(host: str) -> str | None:
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return host
    return None
