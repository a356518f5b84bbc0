"""The engine: inventory in, a supervised run out, typed events on the bus. No UI code here.

Phases: connect every node (bounded concurrency) -> deploy the agent and the workdir -> start the
agents -> start the ranks -> supervise -> stop -> fetch logs. The engine owns all policy: the
first failing rank is the root cause, and any failure stops every rank on every node at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from mscon.agent.protocol import (
    AgentError,
    AllExited,
    Hello,
    Message,
    Metric,
    ProcExited,
    ProcStarted,
    Shutdown,
    Start,
    Stop,
)

from . import exit_codes
from .bundle import WorkdirArchive, agent_bundle, workdir_archive
from .bus import EventBus
from .events import (
    LogsFetched,
    NodeState,
    NodeStatus,
    Notice,
    RankSummary,
    RunFinished,
    RunResult,
    RunStarted,
    RunStatus,
    RunStopping,
)
from .inventory import Inventory
from .plan import NodePlan, build_plan
from .replicas import ReplicaWatch
from .transport import AgentChannel, NodeTransport, NodeUnreachable, SshOptions, make_transport

T = TypeVar("T")

_HELLO_TIMEOUT_S = 60.0
_SCHEDULER_LINGER_S = 5.0
_LARGE_ARCHIVE = 64 * 2**20  # after every worker succeeded, the scheduler gets this long to exit


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass(frozen=True, slots=True)
class RunOptions:
    script: str | None = None  # overrides the inventory's job.script (relative to workdir)
    args: tuple[str, ...] | None = None
    run_id: str | None = None
    logs_root: Path = Path("mscon-runs")
    accept_new_host_keys: bool = False


@dataclass(slots=True)
class RankInfo:
    node: str
    name: str
    rank: int
    started_ts_ns: int | None = None
    exited: ProcExited | None = None
    last_step: int | None = None
    last_loss: float | None = None


@dataclass(slots=True)
class NodeRun:
    plan: NodePlan
    transport: NodeTransport
    channel: AgentChannel | None = None
    done: bool = False  # AllExited seen, or the channel is gone
    lost: bool = False
    error: str = ""
    ranks: list[str] = field(default_factory=list)


class StopRequested(Exception):
    pass


class Engine:
    def __init__(self, inventory: Inventory, options: RunOptions | None = None, bus: EventBus | None = None):
        self.inv = inventory
        self.options = options or RunOptions()
        self.bus = bus or EventBus()
        self.run_id = self.options.run_id or new_run_id()
        self.logs_dir = (self.options.logs_root / self.run_id).resolve()
        self.script = self.options.script or inventory.job.script
        self.args = self.options.args if self.options.args is not None else inventory.job.args
        self.plans = build_plan(inventory, self.script, self.args)
        self.ranks: dict[str, RankInfo] = {}
        for plan in self.plans:
            for spec in plan.procs:
                self.ranks[spec.name] = RankInfo(plan.node.name, spec.name, spec.rank)
        self._stop_reason: str | None = None
        self._stop_wakeup: asyncio.Event | None = None
        self._force = False
        self.stopping = False
        self.stop_reason = ""
        self.failures: list[ProcExited] = []
        self.root_cause: ProcExited | None = None
        self._stop_sent_at: float | None = None
        self._workers_done_at: float | None = None
        self._sched_stop_sent = False
        self._lost_error = ""
        self.replicas = ReplicaWatch(inventory.world_size)

    # ------------------------------------------------------------ control

    def request_stop(self, reason: str = "interrupted") -> None:
        """Ask the run to stop (safe to call from a signal handler on the loop). A second call forces."""
        if self._stop_reason is not None:
            self._force = True
        self._stop_reason = reason
        if self._stop_wakeup is not None:
            self._stop_wakeup.set()

    # ------------------------------------------------------------ run

    async def run(self) -> RunResult:
        self._stop_wakeup = asyncio.Event()
        if self._stop_reason is not None:
            self._stop_wakeup.set()
        t0 = time.monotonic()
        self.bus.publish(
            RunStarted(
                run_id=self.run_id,
                inventory=str(self.inv.path),
                nodes=tuple(p.node.name for p in self.plans),
                world_size=self.inv.world_size,
                logs_dir=str(self.logs_dir),
            )
        )
        sem = asyncio.Semaphore(self.inv.ssh.max_parallel_connects)
        ssh = SshOptions(accept_new_host_keys=self.options.accept_new_host_keys, connect_semaphore=sem)
        nodes = [NodeRun(plan=p, transport=make_transport(self.inv, p.node, ssh)) for p in self.plans]
        for n in nodes:
            n.ranks = [s.name for s in n.plan.procs]
        status, code, reason = RunStatus.ERROR, exit_codes.INTERNAL, "internal error"
        try:
            status, code, reason = await self._run(nodes)
        except StopRequested:
            status, code, reason = (
                RunStatus.INTERRUPTED,
                exit_codes.INTERRUPTED,
                self._stop_reason or "interrupted",
            )
        except Exception as exc:  # a bug: report it in one line, keep the traceback in the run folder
            reason = (
                f"internal error: {type(exc).__name__}: {exc} (traceback: {self.logs_dir}/engine-error.txt)"
            )
            self._save_traceback()
        finally:
            await self._teardown(nodes)
        result = self._result(status, code, reason, time.monotonic() - t0)
        self._write_summary(result)
        self.bus.publish(RunFinished(result))
        self.bus.close()
        return result

    async def _run(self, nodes: list[NodeRun]) -> tuple[RunStatus, int, str]:
        # 1. connect
        errors = await self._each(nodes, self._connect)
        if errors:
            return RunStatus.UNREACHABLE, exit_codes.UNREACHABLE, "; ".join(errors)
        # 2. deploy the agent (and the workdir, for nodes that do not share this filesystem)
        bundle = agent_bundle()
        archive = None
        if any(n.transport.syncs_workdir for n in nodes):
            archive = await asyncio.to_thread(workdir_archive, self.inv.job.workdir, self.inv.job.exclude)
            if len(archive.data) > _LARGE_ARCHIVE:
                self.bus.publish(
                    Notice(
                        f"the workdir {self.inv.job.workdir} packs to {len(archive.data) / 2**20:.0f} MiB "
                        f"({archive.files} files) and is copied to every node; keep data sets out of it "
                        "with job.exclude"
                    )
                )

        async def deploy(n: NodeRun) -> None:
            self.bus.publish(NodeState(n.plan.node.name, NodeStatus.DEPLOYING))
            agent_dir = await n.transport.ensure_agent(bundle)
            remote_archive = None
            if n.transport.syncs_workdir:
                assert archive is not None
                remote_archive = await n.transport.upload_workdir(archive)
            n.channel = await n.transport.start_agent(agent_dir, n.plan.python)
            hello = await self._guard(asyncio.wait_for(n.channel.recv(), _HELLO_TIMEOUT_S))
            if not isinstance(hello, Hello):
                detail = n.channel.stderr_tail().strip().splitlines()[-3:]
                raise NodeUnreachable(
                    f"{n.plan.node.name}: the agent did not start with {n.plan.python}"
                    + (f": {' | '.join(detail)}" if detail else "")
                )
            starts[n.plan.node.name] = self._start_message(n, remote_archive, archive)
            hellos[n.plan.node.name] = hello

        starts: dict[str, Start] = {}
        hellos: dict[str, Hello] = {}
        errors = await self._each(nodes, deploy)
        if errors:  # no rank starts anywhere unless every node is ready
            return RunStatus.UNREACHABLE, exit_codes.UNREACHABLE, "; ".join(errors)

        async def start(n: NodeRun) -> None:
            assert n.channel is not None
            await n.channel.send(starts[n.plan.node.name])
            self.bus.publish(
                NodeState(n.plan.node.name, NodeStatus.RUNNING, f"agent pid {hellos[n.plan.node.name].pid}")
            )

        await asyncio.gather(*(start(n) for n in nodes))
        # 3. supervise until every node reports all its processes gone
        await self._supervise(nodes)
        return self._verdict()

    async def _each(self, nodes: list[NodeRun], step: Callable[[NodeRun], Awaitable[None]]) -> list[str]:
        """Run ``step`` on every node concurrently; one-line errors of the nodes that failed."""

        async def one(n: NodeRun) -> str | None:
            try:
                await step(n)
            except NodeUnreachable as exc:
                n.error = str(exc)
                n.done = n.lost = True
                self.bus.publish(NodeState(n.plan.node.name, NodeStatus.UNREACHABLE, str(exc)))
                return str(exc)
            except TimeoutError:
                msg = f"{n.plan.node.name}: timed out"
                self.bus.publish(NodeState(n.plan.node.name, NodeStatus.UNREACHABLE, msg))
                n.done = n.lost = True
                return msg
            return None

        results = await self._guard(asyncio.gather(*(one(n) for n in nodes)))
        return [r for r in results if r]

    async def _connect(self, n: NodeRun) -> None:
        self.bus.publish(NodeState(n.plan.node.name, NodeStatus.CONNECTING))
        await n.transport.connect()
        self.bus.publish(NodeState(n.plan.node.name, NodeStatus.CONNECTED))

    async def _guard(self, aw: Awaitable[T]) -> T:
        """Await ``aw`` unless a stop is requested first (then StopRequested)."""
        assert self._stop_wakeup is not None
        task = asyncio.ensure_future(aw)
        waiter = asyncio.ensure_future(self._stop_wakeup.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise StopRequested()

    def _start_message(self, n: NodeRun, remote_archive: str | None, archive: WorkdirArchive | None) -> Start:
        run_dir = n.transport.run_dir(self.run_id)
        if n.transport.syncs_workdir:
            cwd = f"{run_dir}/work"
        else:
            cwd = str(self.inv.job.workdir)
        return Start(
            run_id=self.run_id,
            node=n.plan.node.name,
            attempt=0,
            run_dir=run_dir,
            cwd=cwd,
            procs=n.plan.procs,
            workdir_archive=remote_archive,
            grace_s=self.inv.stop.grace_s,
        )

    # ------------------------------------------------------------ supervision

    async def _supervise(self, nodes: list[NodeRun]) -> None:
        inbox: asyncio.Queue[tuple[NodeRun, Message | None]] = asyncio.Queue()

        async def reader(n: NodeRun) -> None:
            assert n.channel is not None
            while True:
                msg = await n.channel.recv()
                await inbox.put((n, msg))
                if msg is None:
                    return

        assert self._stop_wakeup is not None
        async with asyncio.TaskGroup() as tg:
            readers = [tg.create_task(reader(n)) for n in nodes if n.channel is not None and not n.done]
            while not all(n.done for n in nodes):
                if self._stop_wakeup.is_set() and not self.stopping:
                    await self._begin_stop(nodes, self._stop_reason or "interrupted")
                if self._force:
                    break
                try:
                    node, msg = await asyncio.wait_for(inbox.get(), timeout=0.2)
                except TimeoutError:
                    await self._timers(nodes)
                    continue
                await self._handle(nodes, node, msg)
                await self._timers(nodes)
            for task in readers:
                task.cancel()

    async def _timers(self, nodes: list[NodeRun]) -> None:
        now = time.monotonic()
        if self._stop_sent_at is not None and now - self._stop_sent_at > self.inv.stop.grace_s + 15:
            # An agent that does not confirm its stop in time is cut off: closing its channel
            # makes it (or its parent-death signal) kill the ranks.
            for n in nodes:
                if not n.done:
                    n.done = n.lost = True
                    n.error = "did not confirm the stop in time"
                    self.bus.publish(NodeState(n.plan.node.name, NodeStatus.LOST, n.error))
        if (
            self._workers_done_at is not None
            and not self._sched_stop_sent
            and now - self._workers_done_at > _SCHEDULER_LINGER_S
        ):
            self._sched_stop_sent = True
            await self._stop_all(nodes, "scheduler outlived the workers")

    async def _handle(self, nodes: list[NodeRun], n: NodeRun, msg: Message | None) -> None:
        name = n.plan.node.name
        if msg is None:
            if not n.done:
                n.done = n.lost = True
                tail = n.channel.stderr_tail().strip().splitlines() if n.channel else []
                n.error = tail[-1] if tail else ""
                self.bus.publish(NodeState(name, NodeStatus.LOST, n.error or "agent connection closed"))
                if not self.stopping:
                    self._lost_error = f"lost the agent on {name}" + (f": {n.error}" if n.error else "")
                    await self._begin_stop(nodes, self._lost_error)
            return
        self.bus.publish(msg)  # the event first, then what the policy does about it
        if isinstance(msg, ProcStarted):
            self.ranks[msg.name].started_ts_ns = msg.ts_ns
        elif isinstance(msg, Metric):
            info = self.ranks.get(msg.name)
            if info is not None:
                info.last_step, info.last_loss = msg.step, msg.loss
            if msg.checksum is not None:
                divergence = self.replicas.observe(msg.name, msg.step, msg.checksum)
                if divergence is not None:
                    self.bus.publish(divergence)
        elif isinstance(msg, ProcExited):
            self.ranks[msg.name].exited = msg
            # A scheduler that dies while we stop the workers is a victim, not a cause.
            if not msg.ok and not msg.stopped_by_agent and not (self.stopping and msg.rank < 0):
                self.failures.append(msg)
                if not self.stopping:
                    await self._begin_stop(nodes, f"{msg.name} on {msg.node} failed", root=msg)
            self._check_workers_done()
        elif isinstance(msg, AgentError) and not any(self.ranks[r].started_ts_ns for r in n.ranks):
            self._lost_error = f"{name}: {msg.message}"  # the node could not even start its ranks
            if not self.stopping:
                await self._begin_stop(nodes, self._lost_error)
        elif isinstance(msg, AllExited):
            n.done = True
            self.bus.publish(NodeState(name, NodeStatus.DONE))

    def _check_workers_done(self) -> None:
        workers = [r for r in self.ranks.values() if r.rank >= 0]
        if self._workers_done_at is None and all(r.exited is not None and r.exited.ok for r in workers):
            self._workers_done_at = time.monotonic()

    async def _begin_stop(self, nodes: list[NodeRun], reason: str, root: ProcExited | None = None) -> None:
        self.stopping = True
        self.stop_reason = reason
        self._stop_sent_at = time.monotonic()
        if root is not None and self.root_cause is None:
            self.root_cause = root
        self.bus.publish(RunStopping(reason=reason, root_cause=root))
        await self._stop_all(nodes, reason)

    async def _stop_all(self, nodes: list[NodeRun], reason: str) -> None:
        msg = Stop(reason=reason, grace_s=self.inv.stop.grace_s)

        async def send(n: NodeRun) -> None:
            if n.channel is not None and not n.done:
                with contextlib.suppress(Exception):
                    await n.channel.send(msg)

        await asyncio.gather(*(send(n) for n in nodes))

    async def _teardown(self, nodes: list[NodeRun]) -> None:
        async def one(n: NodeRun) -> None:
            if n.channel is not None:
                with contextlib.suppress(Exception):
                    await n.channel.send(Shutdown())
                with contextlib.suppress(Exception):
                    await n.channel.close(wait_s=self.inv.stop.grace_s + 10)
            await self._fetch_logs(n)
            with contextlib.suppress(Exception):
                await n.transport.close()

        await asyncio.gather(*(one(n) for n in nodes))

    async def _fetch_logs(self, n: NodeRun) -> None:
        if n.channel is None or not n.transport.home:
            return
        local = self.logs_dir / n.plan.node.name
        try:
            await n.transport.fetch_run_dir(n.transport.run_dir(self.run_id), str(local))
            self.bus.publish(LogsFetched(n.plan.node.name, str(local)))
        except Exception as exc:  # noqa: BLE001 - a failed fetch is reported, never fatal
            self.bus.publish(LogsFetched(n.plan.node.name, str(local), error=str(exc)))

    # ------------------------------------------------------------ verdict

    def _verdict(self) -> tuple[RunStatus, int, str]:
        if self.failures:
            # First failure by the nodes' clocks; ranks stopped by us are victims, never causes.
            self.root_cause = min(self.failures, key=lambda f: f.ts_ns)
            rc = self.root_cause
            what = rc.signal or f"exit code {rc.exitcode}"
            return RunStatus.FAILED, rc.shell_code, f"{rc.name} on {rc.node} failed first ({what})"
        if self._stop_reason is not None:
            return RunStatus.INTERRUPTED, exit_codes.INTERRUPTED, self._stop_reason
        if self._lost_error:
            return RunStatus.FAILED, exit_codes.UNREACHABLE, self._lost_error
        workers = [r for r in self.ranks.values() if r.rank >= 0]
        if all(r.exited is not None and r.exited.ok for r in workers):
            return RunStatus.SUCCEEDED, exit_codes.OK, "all ranks finished"
        return RunStatus.FAILED, exit_codes.INTERNAL, "ranks ended without a result"

    def _result(self, status: RunStatus, code: int, reason: str, wall_s: float) -> RunResult:
        rows = []
        for info in self.ranks.values():
            e = info.exited
            if e is None:
                text = "never started" if info.started_ts_ns is None else "lost"
            elif e.ok:
                text = "ok"
            elif e.stopped_by_agent:
                text = f"stopped ({e.signal or f'exit {e.exitcode}'})"
            else:
                text = e.signal or f"exit {e.exitcode}"
            wall = None
            if e is not None and info.started_ts_ns is not None:
                wall = (e.ts_ns - info.started_ts_ns) / 1e9
            is_root = self.root_cause is not None and self.root_cause.name == info.name
            rows.append(
                RankSummary(
                    node=info.node,
                    name=info.name,
                    rank=info.rank,
                    status=text,
                    exitcode=e.exitcode if e else None,
                    signal=e.signal if e else None,
                    last_step=info.last_step,
                    last_loss=info.last_loss,
                    wall_s=wall,
                    role="root cause"
                    if is_root
                    else ("victim" if self.root_cause and e and not e.ok else ""),
                )
            )
        return RunResult(
            run_id=self.run_id,
            status=status,
            exit_code=code,
            reason=reason,
            root_cause=self.root_cause,
            ranks=tuple(rows),
            wall_s=wall_s,
            logs_dir=str(self.logs_dir),
            divergent_ranks=tuple(sorted(self.replicas.flagged)),
        )

    def _save_traceback(self) -> None:
        with contextlib.suppress(OSError):
            os.makedirs(self.logs_dir, exist_ok=True)
            (self.logs_dir / "engine-error.txt").write_text(traceback.format_exc(), encoding="utf-8")

    def _write_summary(self, result: RunResult) -> None:
        try:
            os.makedirs(self.logs_dir, exist_ok=True)
            with open(self.logs_dir / "summary.json", "w", encoding="utf-8") as f:
                json.dump(result.to_json(), f, indent=2)
        except OSError:
            pass  # the reporter still prints the summary
