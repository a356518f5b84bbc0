"""The cluster session: connect, deploy, hello, one reader per agent channel, close, fetch logs.

Shared by ``run``, the coming ``check`` and ``attach``. It knows nothing of attempts or policy:
whatever an agent says goes into one inbox as ``(node, message)``, and ``(node, None)`` when the
channel ends. Requests that expect an answer (``Resolve``) are matched here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from mscon.agent.protocol import (
    PROTOCOL_VERSION,
    Hello,
    Message,
    Ping,
    PrunedRun,
    Resolve,
    Resolved,
    RunInfo,
    Shutdown,
    encode,
)
from mscon.console.config import safepath
from mscon.console.config.inventory import Inventory, NodeSpec
from mscon.console.engine import run_ids
from mscon.console.engine.aio import cancel_and_wait, cancels, raise_if_cancelled_since, wait_or_cancel
from mscon.console.engine.events import Event, FetchProgress, LogsFetched, NodeState, NodeUpdate, Notice
from mscon.console.engine.plan import NodePlan
from mscon.console.transport import AgentChannel, NodeTransport, NodeUnreachable, SshOptions, make_transport
from mscon.console.transport.base import decode_line, line_class
from mscon.console.transport.bundle import REMOVE_OLD_AGENTS, WorkdirArchive, agent_bundle, workdir_archive
from mscon.console.transport.reach import line as reach_line
from mscon.console.transport.workdir import GIB, WorkdirRefused

HELLO_TIMEOUT_S = 60.0
M = TypeVar("M", bound=Message)
_LARGE_ARCHIVE = 64 * 2**20
# A fetch is given up when no byte of it came for this long (a large one may take any time).
_FETCH_STALL_S = 120.0
_FETCH_PROGRESS_S = 0.5
_PRUNE_WAIT_S = 600.0


async def _unless_stalled(task: asyncio.Future[int], last_heard: Callable[[], float]) -> int:
    """``task``'s result, or TimeoutError once nothing came for ``_FETCH_STALL_S`` (task cancelled)."""
    started = time.monotonic()
    try:
        while True:
            await asyncio.wait({task}, timeout=_FETCH_STALL_S / 8)
            if task.done():
                return task.result()
            if time.monotonic() - max(last_heard(), started) > _FETCH_STALL_S:
                raise TimeoutError(f"nothing came for {_FETCH_STALL_S:g} s")
    finally:
        if not task.done():
            await cancel_and_wait(task)


class Inbox(Protocol):
    async def put(self, item: tuple[str, Message | None]) -> None: ...

    def put_nowait(self, item: tuple[str, Message | None]) -> None: ...


async def _put_all(inbox: Inbox, node: str, msgs: list[Message]) -> None:
    """A channel's buffered messages into ``inbox``: at once where it takes them together (the
    supervisor's Inputs: its alarms go ahead of the rest before any waits), else one by one."""
    put_all = getattr(inbox, "put_all", None)
    if put_all is not None:
        await put_all(node, msgs)
        return
    for msg in msgs:
        await inbox.put((node, msg))


# How a node is reached: make_transport for SSH and local nodes; tests pass in-process doubles.
TransportFactory = Callable[[Inventory, NodeSpec, SshOptions], NodeTransport]


class ProtocolMismatch(NodeUnreachable):
    pass


@dataclass(slots=True)
class NodeLink:
    plan: NodePlan
    transport: NodeTransport
    channel: AgentChannel | None = None
    hello: Hello | None = None
    open: bool = False  # the channel is up and its reader running
    error: str = ""
    reader: asyncio.Task[None] | None = None
    waiters: dict[str, asyncio.Future[Message]] = field(default_factory=dict)
    hello_waiter: asyncio.Future[Hello | None] | None = None
    remote_archive: str | None = None  # the synced workdir on the node
    agent_dir: str = ""  # where the agent is deployed on the node (once reached)

    @property
    def name(self) -> str:
        return self.plan.node.name


class ClusterSession:
    def __init__(
        self,
        inv: Inventory,
        plans: tuple[NodePlan, ...],
        run_id: str,
        emit: Callable[[Event], None],
        inbox: Inbox,
        accept_new_host_keys: bool = False,
        transport_factory: TransportFactory = make_transport,
        attach: bool = False,
        launches: bool = True,
        attempt_of: Callable[[], int] = lambda: 0,
    ) -> None:
        self.inv = inv
        self.attach = attach  # reach the run's detached agents (a relay each) instead of starting agents
        # False for `mscon check`: no rank of the job starts, so its workdir is neither packed (CPU
        # and time on a large workdir) nor copied to the nodes.
        self.launches = launches
        self.run_id = run_id
        self.emit = emit
        self.inbox = inbox
        self._attempt_of = attempt_of
        sem = asyncio.Semaphore(inv.ssh.max_parallel_connects)
        self._ssh = SshOptions(accept_new_host_keys=accept_new_host_keys, connect_semaphore=sem)
        self._factory = transport_factory
        self.links = {p.node.name: NodeLink(p, transport_factory(inv, p.node, self._ssh)) for p in plans}
        self._archive: WorkdirArchive | None = None
        self._bundle = agent_bundle()

    @property
    def attempt(self) -> int:
        """The current attempt, as ClusterState knows it (the events this session emits carry it)."""
        return self._attempt_of()

    @contextlib.contextmanager
    def diverted(self, inbox: Inbox) -> Iterator[None]:
        """The agents' messages go to ``inbox`` for a while (preflight's conversations with them)."""
        before, self.inbox = self.inbox, inbox
        try:
            yield
        finally:
            self.inbox = before

    @property
    def _syncs(self) -> bool:
        """Whether the job's workdir goes to the nodes: only where the job's ranks will start."""
        return self.launches and not self.attach

    def _state(self, node: str, state: NodeState, detail: str = "") -> None:
        self.emit(NodeUpdate(self.attempt, node, state, detail, time.time_ns()))

    # ------------------------------------------------------------ open

    async def open(self) -> list[str]:
        """Connect and start the agent on every node; one-line errors of the nodes that failed.
        Where the workdir goes to the nodes, it is packed only once every node is reached (an
        unreachable node costs no packing, and a large workdir no wait before that error)."""
        links = list(self.links.values())
        if not (self._syncs and any(link.transport.syncs_workdir for link in links)):
            return await self._each(links, self._open_one)
        errors = await self._each(links, self._reach)
        if errors:
            return errors
        try:
            self._archive = await asyncio.to_thread(
                workdir_archive,
                self.inv.job.workdir,
                self.inv.job.exclude,
                max_bytes=int(self.inv.job.max_workdir_gib * GIB),
            )
        except (WorkdirRefused, OSError) as exc:
            return [f"cannot pack the workdir: {exc}"]
        if self._archive.size > _LARGE_ARCHIVE:
            self.emit(
                Notice(
                    self.attempt,
                    f"the workdir {self.inv.job.workdir} packs to "
                    f"{self._archive.size / 2**20:.0f} MiB ({self._archive.files} files) and is "
                    "copied to every node; keep data sets out of it "
                    "with job.exclude or a .gitignore",
                )
            )
        return await self._each(links, self._start)

    async def reopen(self, node: str) -> str | None:
        """Bring a lost node back (a new connection and agent); its error, or None."""
        link = self.links[node]
        await self._close_link(link, grace_s=0.5)
        link.transport = self._factory(self.inv, link.plan.node, self._ssh)
        link.hello, link.error = None, ""
        errors = await self._each([link], self._open_one)
        return errors[0] if errors else None

    async def _open_one(self, link: NodeLink) -> None:
        await self._reach(link)
        await self._start(link)

    async def _reach(self, link: NodeLink) -> None:
        """Connect and deploy the agent (not started yet)."""
        self._state(link.name, NodeState.CONNECTING)
        await link.transport.connect()
        self._state(link.name, NodeState.DEPLOYING)
        link.agent_dir = await link.transport.ensure_agent(self._bundle)

    async def _start(self, link: NodeLink) -> None:
        """Copy the workdir (where it goes), start the agent and wait for its hello."""
        agent_dir = link.agent_dir
        if self.attach:
            mode = {"mode": "attach", "run": self.run_id, "cache": link.transport.cache_root}
            link.channel = await link.transport.start_agent(agent_dir, link.plan.python, mode)
        else:
            if self._syncs and link.transport.syncs_workdir:
                assert self._archive is not None
                link.remote_archive = await link.transport.upload_workdir(self._archive)
            link.channel = await link.transport.start_agent(agent_dir, link.plan.python)
        link.hello_waiter = asyncio.get_running_loop().create_future()
        link.open = True
        link.reader = asyncio.get_running_loop().create_task(self._read(link), name=f"reader:{link.name}")
        try:
            hello = await asyncio.wait_for(asyncio.shield(link.hello_waiter), HELLO_TIMEOUT_S)
        except TimeoutError:
            hello = None
        if hello is None:
            detail = link.channel.stderr_tail().strip().splitlines()[-3:]
            raise NodeUnreachable(
                f"{link.name}: the agent did not start with {link.plan.python}"
                + (f": {' | '.join(detail)}" if detail else "")
            )
        if hello.protocol != PROTOCOL_VERSION:
            raise ProtocolMismatch(
                f"{link.name}: the agent speaks protocol {hello.protocol}, this console {PROTOCOL_VERSION}; "
                + REMOVE_OLD_AGENTS
            )
        link.hello = hello
        self._state(link.name, NodeState.READY, f"agent pid {hello.pid} on {hello.hostname}")

    async def _read(self, link: NodeLink) -> None:
        """The channel's one reader, for its whole life; never raises."""
        channel = link.channel
        assert channel is not None
        try:
            # What is buffered is taken together, so that an exit or a hang among it reaches the
            # policy before the reader waits with a backlog ahead of it (issue 44).
            while lines := await channel.read_ready():
                await self._hand_on(link, lines)
        except Exception as exc:  # noqa: BLE001 - a broken channel is a lost node, not a crash
            link.error = f"{type(exc).__name__}: {exc}"
        finally:
            if link.hello_waiter is not None and not link.hello_waiter.done():
                link.hello_waiter.set_result(None)
            for waiter in link.waiters.values():
                if not waiter.done():
                    waiter.cancel()
            if link.open and channel is link.channel:
                link.open = False
                if not link.error:
                    tail = channel.stderr_tail().strip().splitlines()
                    link.error = tail[-1] if tail else "agent connection closed"
                self.inbox.put_nowait((link.name, None))

    async def _hand_on(self, link: NodeLink, lines: list[str]) -> None:
        """A channel's lines as read together. With an alarm among them, all are decoded and the
        alarms go ahead before anything waits; else each is decoded only once the inbox has room
        for it, and a sample the console would drop is dropped undecoded (at 3,000 nodes the
        readers decoded a summary tick's 6,000 messages in one turn of the loop, most of them
        dropped, before the supervisor could take an exit: issue 44)."""
        classes = [line_class(line) for line in lines]
        if any(cls is not None and cls.alarm for cls in classes):
            decoded = (decode_line(line) for line in lines)
            msgs = [m for m in decoded if m is not None and not self._answered(link, m)]
            await _put_all(self.inbox, link.name, msgs)
            return
        room = getattr(self.inbox, "room_for", None)
        for line, cls in zip(lines, classes, strict=True):
            awaited = cls is Hello or (cls is not None and cls.type in link.waiters)  # not for the inbox
            if room is not None and not awaited and not await room(cls is not None and cls.sampled):
                continue
            msg = decode_line(line)
            if msg is None or self._answered(link, msg):
                continue
            if room is not None:
                self.inbox.put_nowait((link.name, msg))  # its room waited for once already, not twice
            else:
                await self.inbox.put((link.name, msg))

    @staticmethod
    def _answered(link: NodeLink, msg: Message) -> bool:
        """Whether ``msg`` is the hello or an answer someone waits for (then it goes to them)."""
        if isinstance(msg, Hello) and link.hello_waiter is not None and not link.hello_waiter.done():
            link.hello_waiter.set_result(msg)
            return True
        waiter = link.waiters.pop(msg.type, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(msg)
            return True
        return False

    async def _each(self, links: list[NodeLink], step: Callable[[NodeLink], Awaitable[None]]) -> list[str]:
        async def one(link: NodeLink) -> str | None:
            try:
                await step(link)
            except NodeUnreachable as exc:
                link.error = str(exc)
            except TimeoutError:
                link.error = f"{link.name}: timed out"
            except (OSError, safepath.UnsafePath) as exc:  # UnsafePath: a run dir that would escape
                link.error = f"{link.name}: {exc}"
            else:
                return None
            link.open = False
            # The one line a user sees: the error, the transport it failed on, and what to do.
            self._state(link.name, NodeState.UNREACHABLE, reach_line(link.transport.kind, link.error))
            return link.error

        results = await asyncio.gather(*(one(link) for link in links))
        return [r for r in results if r]

    # ------------------------------------------------------------ talking

    async def send(self, node: str, msg: Message) -> bool:
        link = self.links[node]
        if not link.open or link.channel is None:
            return False
        try:
            await link.channel.send(msg)
        except Exception:  # noqa: BLE001 - the reader reports the lost channel
            return False
        return True

    async def _send_line(self, node: str, line: str) -> None:
        link = self.links[node]
        if link.open and link.channel is not None:
            with contextlib.suppress(Exception):  # the reader reports the lost channel
                await link.channel.send_line(line)

    def _send_now(self, nodes: Iterable[str], line: str) -> list[str]:
        """``line`` handed to every open channel of ``nodes`` that takes it at once (no wait for a
        buffer to drain, no task each); the nodes whose channels can only send by awaiting."""
        slow = []
        for node in nodes:
            link = self.links[node]
            if not link.open or link.channel is None:
                continue
            try:
                if not link.channel.send_now(line):
                    slow.append(node)
            except Exception:  # noqa: BLE001, S112 - the reader reports the lost channel
                continue
        return slow

    async def broadcast(self, msg: Message, nodes: list[str] | None = None) -> None:
        """``msg`` to every node (or ``nodes``), encoded once and written to each channel in one
        pass: a Stop reaches the last of 10,000 nodes' sockets without a task per node, and does
        not wait for any channel's buffer to drain."""
        line = encode(msg)
        slow = self._send_now(nodes or list(self.links), line)
        await asyncio.gather(*(self._send_line(n, line) for n in slow))

    async def ping(self) -> None:
        """Tell every agent we are here; a channel that does not take it within a second is skipped
        (a partitioned node: its keepalive or its agent's watchdog ends it)."""
        line = encode(Ping())
        slow = self._send_now(self.links, line)

        async def one(node: str) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._send_line(node, line), 1.0)

        await asyncio.gather(*(one(n) for n in slow))

    async def request(self, node: str, msg: Message, reply: type[M], wait_s: float) -> M | str:
        """Send ``msg`` and wait for the node's answer of type ``reply``; a one-line error instead."""
        link = self.links[node]
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        link.waiters[reply.type] = fut
        if not await self.send(node, msg):
            link.waiters.pop(reply.type, None)
            return "the node's agent is not connected"
        before = cancels()
        try:
            answer = await asyncio.wait_for(fut, wait_s)
        except (TimeoutError, asyncio.CancelledError):  # CancelledError: the channel ended (_read)
            link.waiters.pop(reply.type, None)
            raise_if_cancelled_since(before)  # but never swallow our caller's own cancellation
            return f"no answer from the agent in {wait_s:g} s"
        assert isinstance(answer, reply)
        return answer

    async def resolve(self, node: str, host: str, wait_s: float = 15.0) -> Resolved:
        answer = await self.request(node, Resolve(host=host), Resolved, wait_s)
        if isinstance(answer, str):
            return Resolved(node=node, host=host, error=answer)
        return answer

    def run_dir(self, node: str) -> str:
        return self.links[node].transport.run_dir(self.run_id)

    # ------------------------------------------------------------ close

    async def close(self, grace_s: float, keep_warm_s: float = 0.0) -> None:
        """Shut every agent down (``keep_warm_s``: each leaves a standby for the next run first)."""
        await asyncio.gather(
            *(self._close_link(link, grace_s + 10, keep_warm_s) for link in self.links.values())
        )

    async def _close_link(self, link: NodeLink, grace_s: float, keep_warm_s: float = 0.0) -> None:
        if link.channel is not None:
            if link.open:
                with contextlib.suppress(Exception):
                    await link.channel.send(Shutdown(keep_warm_s=keep_warm_s))
            link.open = False  # from here on an ended channel is our doing, not a lost node
            with contextlib.suppress(Exception):
                await link.channel.close(wait_s=grace_s)
        if link.reader is not None:
            await cancel_and_wait(link.reader)

    async def release(self) -> None:
        """Let every (detached) agent go: our channels close, the agents and their ranks run on."""

        async def one(link: NodeLink) -> None:
            link.open = False  # an ending channel is now our doing, not a lost node
            if link.channel is not None:
                with contextlib.suppress(Exception):
                    await link.channel.release()
            if link.reader is not None:
                await wait_or_cancel(link.reader, 5.0)

        await asyncio.gather(*(one(link) for link in self.links.values()))

    async def claim_free_run_id(self, logs_root: Path) -> str:
        """For a generated run id, once every node is open: the first of the id and its suffixes
        (``slurm-123``, ``slurm-123.1``, ...) that no node holds a folder for, nor ``logs_root``, so
        an earlier run's folder is never reused; it becomes this session's id. A node that cannot
        be asked raises ``NodeUnreachable``."""

        async def taken(run_id: str) -> bool:
            local = safepath.within(logs_root, run_id)
            # The current id's local folder is this run's own (it records from the start).
            if run_id != self.run_id and (local.exists() or local.is_symlink()):
                return True
            links = [link for link in self.links.values() if link.open]
            return any(await asyncio.gather(*(link.transport.holds_run(run_id) for link in links)))

        self.run_id = await run_ids.first_free(self.run_id, taken)
        return self.run_id

    async def list_runs(self) -> tuple[list[RunInfo], list[str]]:
        """Every run the nodes hold (``mscon ls``), and the one-line errors of unreachable nodes."""
        return await self._ask_each("ls", {}, RunInfo, HELLO_TIMEOUT_S)

    async def prune_runs(
        self, keep: int, older_than_days: float | None, dry_run: bool
    ) -> tuple[list[PrunedRun], list[str]]:
        """``mscon prune`` on every node (agent/retention.py decides): the run folders each node
        removed (or, dry, would), and the one-line errors of unreachable nodes."""
        prune = {"keep": keep, "older_than_days": older_than_days, "dry_run": dry_run}
        # Deleting one large run folder may take a while: the wait is per answer.
        return await self._ask_each("prune", {"prune": prune}, PrunedRun, _PRUNE_WAIT_S)

    async def _ask_each(
        self, mode: str, extra: dict, answer: type[M], wait_s: float
    ) -> tuple[list[M], list[str]]:
        """Start each node's agent once in a one-shot ``mode`` (its header also carries ``extra``),
        and gather its ``answer`` messages (each within ``wait_s`` of the last) until it ends; with
        the unreachable nodes' one-line errors."""
        found: list[M] = []

        async def one(link: NodeLink) -> None:
            self._state(link.name, NodeState.CONNECTING)
            await link.transport.connect()
            agent_dir = await link.transport.ensure_agent(self._bundle)
            header = {"mode": mode, "cache": link.transport.cache_root, **extra}
            channel = await link.transport.start_agent(agent_dir, link.plan.python, header)
            try:
                while (msg := await asyncio.wait_for(channel.recv(), wait_s)) is not None:
                    if isinstance(msg, answer):
                        found.append(msg)
            finally:
                await channel.close(wait_s=5.0)

        errors = await self._each(list(self.links.values()), one)
        return found, errors

    async def cut(self, node: str) -> None:
        """Close one node's channel now (its agent sees EOF and stops its ranks itself)."""
        await self._close_link(self.links[node], 0.5)

    async def abort(self) -> None:
        """Cut every channel now: each agent sees EOF and stops its ranks itself."""
        await asyncio.gather(*(self._close_link(link, 0.5) for link in self.links.values()))

    async def fetch_logs(self, logs_dir: Path, include: tuple[str, ...] = ()) -> None:
        """Copy each node's run folder back (less its checkpoints unless ``include`` names them:
        ``layout.FETCHED_ON_REQUEST``); a LogsFetched per node, FetchProgress while they come."""
        links = [link for link in self.links.values() if link.hello is not None and link.transport.home]
        moved = dict.fromkeys((link.name for link in links), 0)
        heard = dict.fromkeys(moved, time.monotonic())
        done = 0
        t0 = time.monotonic()

        async def one(link: NodeLink) -> None:
            nonlocal done

            def progress(n: int) -> None:  # from a transport's thread too: one writer per key
                moved[link.name] += n
                heard[link.name] = time.monotonic()

            start = time.monotonic()
            try:
                local = safepath.within(logs_dir, link.name)
                remote = link.transport.run_dir(self.run_id)
                fetch = link.transport.fetch_run_dir(
                    remote, str(local), logs_root=str(logs_dir), include=include, progress=progress
                )
                size = await _unless_stalled(asyncio.ensure_future(fetch), lambda: heard[link.name])
                seconds = time.monotonic() - start
                self.emit(LogsFetched(self.attempt, link.name, str(local), bytes=size, seconds=seconds))
            except Exception as exc:  # noqa: BLE001 - a failed fetch is reported, never fatal
                error = str(exc) or type(exc).__name__
                self.emit(
                    LogsFetched(
                        self.attempt,
                        link.name,
                        str(logs_dir / link.name),
                        error=error,
                        bytes=moved[link.name],
                        seconds=time.monotonic() - start,
                    )
                )
            finally:
                done += 1

        async def report() -> None:
            while True:
                await asyncio.sleep(_FETCH_PROGRESS_S)
                total = sum(moved.values())
                self.emit(FetchProgress(self.attempt, total, done, len(links), time.monotonic() - t0))

        reporter = asyncio.get_running_loop().create_task(report(), name="fetch-progress")
        try:
            await asyncio.gather(*(one(link) for link in links))
        finally:
            await cancel_and_wait(reporter)

    async def disconnect(self) -> None:
        async def one(link: NodeLink) -> None:
            with contextlib.suppress(Exception):
                await link.transport.close()

        await asyncio.gather(*(one(link) for link in self.links.values()))
