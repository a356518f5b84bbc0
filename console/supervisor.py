"""The job supervisor: attempts, the restart budget, hang timers, and the commands that steer them.

In the manner of torchrun's ``_invoke_run``: one ``Attempt`` per launch of the whole group; a
failed attempt is followed by another (after ``restart.backoff_s``) while the budget lasts. The
supervisor awaits one input queue (commands first, then timer ticks, then agent messages); it
decides, ClusterState records, and the root cause is ClusterState's to compute. No UI code here.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import ipaddress
import itertools
import json
import os
import secrets
import socket
import time
import traceback
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, TypeVar

from mscon.agent.protocol import (
    AgentError,
    AllExited,
    Detach,
    Detached,
    Inspect,
    LogBatch,
    Message,
    Metric,
    MetricBatch,
    ProcExited,
    ProcHung,
    ProcSpec,
    ProcStarted,
    Role,
    Start,
    Stop,
)

from . import exit_codes
from .bus import EventBus
from .commands import Command, DetachRun, RestartGroup, StopJob
from .events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptStarted,
    Event,
    FailureKind,
    JobState,
    NodeState,
    NodeUpdate,
    Notice,
    RankRef,
    Restarting,
    RunFinished,
    RunResult,
    RunStarted,
    Stopping,
)
from .inventory import Inventory
from .plan import build_plan, with_scheduler
from .replicas import ReplicaWatch
from .runrecord import DetachRecord, write_record
from .session import ClusterSession, TransportFactory
from .state import ClusterState, describe
from .transport import make_transport

if TYPE_CHECKING:
    from .preflight import Preflight

T = TypeVar("T")

_SCHEDULER_LINGER_S = 5.0  # after every worker succeeded, the scheduler gets this long to exit
_STOP_CONFIRM_S = 15.0  # beyond the grace period: an agent that has not confirmed its stop is cut off
_TICK_S = 0.25


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass(frozen=True, slots=True)
class RunOptions:
    script: str | None = None  # overrides the inventory's job.script (relative to workdir)
    args: tuple[str, ...] | None = None
    run_id: str | None = None
    logs_root: Path = Path("mscon-runs")
    accept_new_host_keys: bool = False
    max_restarts: int | None = None  # overrides restart.max_restarts
    preflight: Preflight | None = None  # checks before the first attempt (mscon check, mscon run)
    detach: bool = False  # detach as soon as the first attempt has started (mscon run --detach)


class _Tick:
    pass


_TICK = _Tick()


@dataclass(frozen=True, slots=True)
class _Alarm:
    """A failure seen by a channel's reader: it jumps the queue so the stop goes out at once, not
    after the log batches queued ahead of it (at 1,000 nodes, seconds of them). The message itself
    still follows in order, for the state and the views."""

    node: str
    msg: ProcExited | ProcHung


def _alarming(msg: Message | None) -> bool:
    return (isinstance(msg, ProcExited) and not msg.ok and not msg.stopped_by_agent) or isinstance(
        msg, ProcHung
    )


Input = Command | _Tick | _Alarm | tuple[str, Message | None]


class Inputs:
    """Everything the supervisor reacts to, in one queue: commands first, then ticks, then agents."""

    def __init__(self) -> None:
        self._q: asyncio.PriorityQueue[tuple[int, int, Input]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self.tick_pending = False

    def put_nowait(self, item: Input) -> None:
        if isinstance(item, tuple):
            node, msg = item
            if _alarming(msg):
                assert isinstance(msg, ProcExited | ProcHung)
                self._q.put_nowait((0, next(self._seq), _Alarm(node, msg)))
            self._q.put_nowait((2, next(self._seq), item))
            return
        prio = 0 if isinstance(item, StopJob | RestartGroup | DetachRun | _Alarm) else 1
        self._q.put_nowait((prio, next(self._seq), item))

    async def put(self, item: Input) -> None:
        self.put_nowait(item)

    async def get(self) -> Input:
        return (await self._q.get())[2]

    def get_nowait(self) -> Input:
        return self._q.get_nowait()[2]

    def empty(self) -> bool:
        return self._q.empty()


@dataclass(slots=True)
class Attempt:
    number: int
    started: float = field(default_factory=time.monotonic)
    done: set[str] = field(default_factory=set)  # nodes whose processes have all exited (or are lost)
    stop_sent_at: float | None = None
    stop_cmd: StopJob | None = None
    restart_requested: bool = False
    forced: bool = False
    workers_done_at: float | None = None
    sched_stop_sent: bool = False
    progress: dict[str, float] = field(default_factory=dict)  # rank -> monotonic time of last progress
    inspected: set[str] = field(default_factory=set)
    detached: bool = False

    @property
    def stopping(self) -> bool:
        return self.stop_sent_at is not None


class Supervisor:
    def __init__(
        self,
        inventory: Inventory,
        options: RunOptions | None = None,
        bus: EventBus | None = None,
        transport_factory: TransportFactory = make_transport,
    ):
        self._factory = transport_factory
        self.inv = inventory
        self.options = options or RunOptions()
        self.bus = bus or EventBus()
        self.state = ClusterState()
        self.run_id = self.options.run_id or new_run_id()
        self.logs_dir = (self.options.logs_root / self.run_id).resolve()
        self.script = self.options.script or inventory.job.script
        self.args = self.options.args if self.options.args is not None else inventory.job.args
        self.plans = build_plan(inventory, self.script, self.args)
        mr = self.options.max_restarts
        self.max_restarts = mr if mr is not None else inventory.restart.max_restarts
        self.backoff_s = inventory.restart.backoff_s
        self.hang_timeout_s = inventory.hang.timeout_s
        self._inputs: Inputs | None = None
        self._early: list[Command] = []
        self._att: Attempt | None = None
        self.session: ClusterSession | None = None
        self._stop_cmd: StopJob | None = None
        self.replicas = ReplicaWatch(inventory.world_size)
        self._sched = ""
        self._restarts_used = 0
        self.detached = False

    # ------------------------------------------------------------ commands and events

    def submit(self, cmd: Command) -> None:
        """Queue a command (call on the loop's thread; signal handlers and the UI do)."""
        if isinstance(cmd, StopJob) and self._stop_cmd is None:
            self._stop_cmd = cmd
        if self._inputs is None:
            self._early.append(cmd)
        else:
            self._inputs.put_nowait(cmd)

    def closing_command(self) -> Command:
        """What a console that closes without a choice sends: a run it started dies with it."""
        return StopJob("the console was closed")

    def emit(self, ev: Event) -> None:
        self.bus.attempt = ev.attempt
        self.state.apply(ev)
        self.bus.publish(ev)

    @property
    def attempt_no(self) -> int:
        return self._att.number if self._att else 0

    # ------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        t0 = time.monotonic()
        self._inputs = Inputs()
        for cmd in self._early:
            self._inputs.put_nowait(cmd)
        self.emit(
            RunStarted(
                attempt=0,
                run_id=self.run_id,
                inventory=str(self.inv.path),
                nodes=tuple(p.node.name for p in self.plans),
                world_size=self.inv.world_size,
                hosts=tuple(p.node.host for p in self.plans),
                logs_dir=str(self.logs_dir),
                max_restarts=self.max_restarts,
            )
        )
        session = self.session = ClusterSession(
            self.inv,
            self.plans,
            self.run_id,
            self.emit,
            self._inputs,
            self.options.accept_new_host_keys,
            self._factory,
            launches=self.options.preflight is None or not self.options.preflight.options.checks_only,
        )
        ticker = asyncio.get_running_loop().create_task(self._ticker(), name="ticker")
        status, code, reason = JobState.ERROR, exit_codes.INTERNAL, "internal error"
        try:
            status, code, reason = await self._run(session)
        except Exception as exc:  # a bug: one line for the user, the traceback in the run folder
            reason = (
                f"internal error: {type(exc).__name__}: {exc} (traceback: {self.logs_dir}/engine-error.txt)"
            )
            self._save_traceback()
        finally:
            ticker.cancel()
            if self.detached:
                self._record_detach()  # the ranks run on: nothing to stop, logs are not final yet
            else:
                await session.close(self.inv.stop.grace_s)
                await session.fetch_logs(self.logs_dir)
            await session.disconnect()
        result = self._result(status, code, reason, time.monotonic() - t0)
        self._write_summary(result)
        self.emit(RunFinished(self.attempt_no, result))
        await self.bus.close()
        return result

    async def _ticker(self) -> None:
        assert self._inputs is not None and self.session is not None
        last_ping = time.monotonic()
        while True:
            await asyncio.sleep(_TICK_S)
            if not self._inputs.tick_pending:
                self._inputs.tick_pending = True
                self._inputs.put_nowait(_TICK)
            if time.monotonic() - last_ping >= self.inv.ssh.keepalive_s:
                last_ping = time.monotonic()
                await self.session.ping()

    async def _run(self, session: ClusterSession) -> tuple[JobState, int, str]:
        errors = await self._unless_stopped(session.open())
        if self._stop_cmd is not None:
            return JobState.INTERRUPTED, self._stop_cmd.exit_code, self._stop_cmd.reason
        if errors:
            if self.options.preflight is not None:
                self.options.preflight.unreachable(self, session)
            return JobState.UNREACHABLE, exit_codes.UNREACHABLE, "; ".join(errors)
        found = await self._unless_stopped(self._scheduler_address(session))
        if found is None or self._stop_cmd is not None:
            stop = self._stop_cmd or StopJob()
            return JobState.INTERRUPTED, stop.exit_code, stop.reason
        sched, error, code = found
        if sched is None:
            return JobState.FAILED, code, error
        self._sched = sched
        if self.options.preflight is not None:
            verdict = await self._unless_stopped(self.options.preflight.run(self, session, sched))
            if verdict is None or self._stop_cmd is not None:
                stop = self._stop_cmd or StopJob()
                return JobState.INTERRUPTED, stop.exit_code, stop.reason
            if not verdict.proceed:
                return verdict.status, verdict.exit_code, verdict.reason
        number, restarts_used = 0, 0
        while True:
            outcome = await self._attempt(session, number, sched)
            if outcome is AttemptOutcome.DETACHED:
                return (
                    JobState.DETACHED,
                    exit_codes.OK,
                    f"detached: the run goes on (mscon attach {self.run_id})",
                )
            if outcome in (AttemptOutcome.SUCCEEDED, AttemptOutcome.INTERRUPTED):
                break
            if outcome is AttemptOutcome.FAILED:
                if restarts_used >= self.max_restarts:
                    break
                restarts_used += 1
                self._restarts_used = restarts_used
            why = (
                "restart requested"
                if outcome is AttemptOutcome.RESTART_REQUESTED
                else f"attempt {number} failed: {describe(self.state.root_cause())}"
            )
            if self._is_trainer() and self.max_restarts == 0 and "--checkpoint-dir" not in self.args:
                why += "; the trainer has no checkpoints (no --checkpoint-dir): it starts from step 0"
            self.emit(Restarting(number + 1, why, self.backoff_s, self.max_restarts - restarts_used))
            await self._unless_stopped(asyncio.sleep(self.backoff_s), restart_cuts=True)
            for name in [n for n, link in session.links.items() if not link.open]:
                if self._stop_cmd is None:
                    error = await self._unless_stopped(session.reopen(name))
                    if error:
                        return JobState.FAILED, exit_codes.UNREACHABLE, f"cannot restart: {error}"
            if self._stop_cmd is not None:
                break
            number += 1
        return self._verdict()

    async def _unless_stopped(
        self, aw: Awaitable[T], limit_s: float | None = None, restart_cuts: bool = False
    ) -> T | None:
        """Await ``aw`` while serving the input queue; None when a StopJob (or ``limit_s``, or with
        ``restart_cuts`` a RestartGroup: the operator's `r` during a backoff) came first."""
        assert self._inputs is not None
        task = asyncio.ensure_future(aw)
        deadline = None if limit_s is None else time.monotonic() + limit_s
        while not task.done():
            getter = asyncio.ensure_future(self._inputs.get())
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait({task, getter}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
                if not getter.cancelled():  # it got an item while being cancelled: keep it
                    self._requeue(getter.result())
                if not task.done():  # timed out
                    break
                continue
            item = getter.result()
            if isinstance(item, _Tick):
                self._inputs.tick_pending = False
            elif isinstance(item, DetachRun):
                self.emit(Notice(self.attempt_no, "cannot detach now: no attempt is running"))
            elif isinstance(item, _Alarm):
                pass  # between attempts: its message follows and is taken in below
            elif isinstance(item, StopJob) or (isinstance(item, RestartGroup) and restart_cuts):
                break
            elif isinstance(item, tuple):
                node, msg = item
                if msg is None:
                    self.emit(
                        NodeUpdate(
                            self.attempt_no, node, NodeState.LOST, self._link_error(node), time.time_ns()
                        )
                    )
                else:
                    self.emit(AgentEvent(self.attempt_no, msg))  # late telemetry between attempts
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return None

    def _link_error(self, node: str) -> str:
        return self.session.links[node].error if self.session is not None else ""

    def _requeue(self, item: Input) -> None:
        assert self._inputs is not None
        self._inputs.put_nowait(item)

    # ------------------------------------------------------------ the scheduler's address

    async def _scheduler_address(self, session: ClusterSession) -> tuple[str | None, str, int]:
        """MS_SCHED_HOST must be an IP: MindSpore does not resolve names (``Parse ip failed``).

        ``scheduler.host`` or the first node's ``address`` win and are resolved by the agent on
        the first node; otherwise the address the first node's agent was reached on (its
        SSH_CONNECTION), else its resolved HostName.
        """
        first = self.plans[0].node
        link = session.links[first.name]
        given = self.inv.scheduler.host or first.address
        field_name = "scheduler.host" if self.inv.scheduler.host else f"nodes[0].address ({first.name})"
        if given is None:
            if first.transport == "local":
                return "127.0.0.1", "", 0
            if link.hello is not None and link.hello.ssh_addr and _is_ip(link.hello.ssh_addr):
                return link.hello.ssh_addr, "", 0
            given = link.transport.resolved_host()
            field_name = f"nodes[0].host ({first.name})"
        if _is_ip(given):
            return given, "", 0
        answer = await session.resolve(first.name, given)
        if answer.address:
            return answer.address, "", 0
        return (
            None,
            f"{self.inv.path}: {field_name}: cannot resolve {given!r} to an IP address on {first.name} "
            f"({answer.error}); MindSpore needs an IP in MS_SCHED_HOST: set scheduler.host",
            exit_codes.USAGE if self.inv.scheduler.host or first.address else exit_codes.UNREACHABLE,
        )

    # ------------------------------------------------------------ one attempt

    def _watchdog_s(self) -> float:
        """How long an agent waits for word from us before it stops its ranks: a few pings missed."""
        return max(5.0, 3 * self.inv.ssh.keepalive_s + 2)

    def _is_trainer(self) -> bool:
        return PurePosixPath(self.script.replace("\\", "/")).parts[-2:] == ("trainer", "train.py")

    def _argv(self, spec: ProcSpec, node: str, number: int) -> tuple[str, ...]:
        """The attempt's command line: resume where the previous attempt left off."""
        argv = spec.argv
        if self._is_trainer():
            # Only with a restart budget: checkpoints cost time (and would skew bench/trainer.py).
            if self.max_restarts > 0 and "--checkpoint-dir" not in argv:
                assert self.session is not None
                argv += ("--checkpoint-dir", f"{self.session.run_dir(node)}/checkpoints")
            if number > 0 and "--checkpoint-dir" in argv and "--resume" not in argv:
                argv += ("--resume",)
        elif number > 0:
            argv += self.inv.job.resume_args
        return argv

    async def _attempt(self, session: ClusterSession, number: int, sched: str) -> AttemptOutcome:
        assert self._inputs is not None
        att = self._att = Attempt(number)
        session.attempt = number
        self.replicas = ReplicaWatch(self.inv.world_size, number)
        refs = tuple(RankRef(s.name, p.node.name, s.rank) for p in self.plans for s in p.procs)
        self.emit(AttemptStarted(number, refs, sched, self.inv.scheduler.port, time.time_ns()))

        async def start(plan_index: int) -> None:
            name = self.plans[plan_index].node.name
            link = session.links[name]
            msg = self._start_msg(session, plan_index, number, sched)
            if await session.send(name, msg):
                self.emit(NodeUpdate(number, name, NodeState.RUNNING, f"attempt {number}", time.time_ns()))
            elif not link.open:  # lost before its ranks could start
                await self._node_lost(att, name)

        await asyncio.gather(*(start(i) for i in range(len(self.plans))))
        if self.options.detach and number == 0:
            self._inputs.put_nowait(DetachRun("--detach"))
        while len(att.done) < len(self.plans) and not att.forced and not att.detached:
            item = await self._inputs.get()
            await self._handle(att, item)
        if att.detached:
            await self._let_go(session, att)
            return AttemptOutcome.DETACHED
        if att.forced:
            await session.abort()
        if att.stop_cmd is not None:
            outcome, reason = AttemptOutcome.INTERRUPTED, att.stop_cmd.reason
        elif att.restart_requested:
            outcome, reason = AttemptOutcome.RESTART_REQUESTED, "restart requested"
        elif self.state.workers_succeeded():
            outcome, reason = AttemptOutcome.SUCCEEDED, "all ranks finished"
        else:
            outcome, reason = AttemptOutcome.FAILED, describe(self.state.root_cause())
        root = self.state.root_cause() if outcome is AttemptOutcome.FAILED else None
        self.emit(AttemptEnded(number, outcome, reason, root, time.time_ns()))
        return outcome

    def _start_msg(self, session: ClusterSession, plan_index: int, number: int, sched: str) -> Start:
        plan = self.plans[plan_index]
        name = plan.node.name
        procs = tuple(replace(with_scheduler(s, sched), argv=self._argv(s, name, number)) for s in plan.procs)
        link = session.links[name]
        run_dir = session.run_dir(name)
        cwd = f"{run_dir}/work" if link.transport.syncs_workdir else str(self.inv.job.workdir)
        return Start(
            run_id=self.run_id,
            node=name,
            attempt=number,
            run_dir=run_dir,
            cwd=cwd,
            procs=procs,
            workdir_archive=link.remote_archive if number == 0 else None,
            grace_s=self.inv.stop.grace_s,
            metrics_pattern=self.inv.job.metrics_pattern,
            watchdog_s=self._watchdog_s(),
        )

    # ------------------------------------------------------------ detach

    async def _detach(self, att: Attempt) -> str | None:
        """Hand the run to the nodes: node 0's agent coordinates, the others follow it; the error
        (the run then stays attached, nothing changed) or None."""
        session = self.session
        assert session is not None
        if att.stopping:
            return "the run is stopping"
        down = [n for n, link in session.links.items() if not link.open or n in att.done]
        if down:
            return f"{down[0]} has no running agent"
        names = [p.node.name for p in self.plans]
        secret = secrets.token_hex(32)
        console = f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"
        next_starts = tuple(
            self._start_msg(session, i, att.number + 1, self._sched).to_dict() for i in range(len(self.plans))
        )
        wait_s = 15.0
        lead = await session.request(
            names[0],
            Detach(
                role=Role.COORDINATOR,
                secret=secret,
                nodes=tuple(names),
                restarts_left=max(0, self.max_restarts - self._restarts_used),
                backoff_s=self.backoff_s,
                hang_timeout_s=self.hang_timeout_s,
                next_starts=next_starts,
                console=console,
            ),
            Detached,
            wait_s,
        )
        if isinstance(lead, str) or lead.error:
            return f"{names[0]}: {lead if isinstance(lead, str) else lead.error}"
        follow = Detach(
            role=Role.FOLLOWER,
            secret=secret,
            coordinator_host=self._sched,
            coordinator_port=lead.coordinator_port,
            hang_timeout_s=self.hang_timeout_s,
            console=console,
        )
        answers = await asyncio.gather(*(session.request(n, follow, Detached, wait_s) for n in names[1:]))
        errors = [
            f"{n}: {a if isinstance(a, str) else a.error}"
            for n, a in zip(names[1:], answers, strict=True)
            if isinstance(a, str) or a.error
        ]
        if errors:
            # Back to normal on every node: the console keeps the policy.
            await asyncio.gather(
                *(session.request(n, Detach(role="cancel"), Detached, wait_s) for n in names)
            )
            return "; ".join(errors)
        return None

    async def _let_go(self, session: ClusterSession, att: Attempt) -> None:
        """Close our channels and take in what they delivered before closing (the lines we print
        are the lines a later attach does not replay)."""
        await session.release()
        assert self._inputs is not None
        while not self._inputs.empty():
            item = self._inputs.get_nowait()
            if isinstance(item, tuple) and item[1] is not None:
                self.emit(AgentEvent(att.number, item[1]))

    def _record_detach(self) -> None:
        att = self.state.attempt
        record = DetachRecord(
            run_id=self.run_id,
            inventory=str(Path(self.inv.path).resolve()),
            script=self.script,
            args=tuple(self.args),
            attempt=att.number if att is not None else 0,
            log_seq={r.name: r.next_seq for r in self.state.ranks.values()},
            detached_at=time.time(),
        )
        with contextlib.suppress(OSError):
            write_record(self.logs_dir, record)

    async def _handle(self, att: Attempt, item: Input) -> None:
        if isinstance(item, DetachRun):
            error = await self._detach(att)
            if error is None:
                att.detached = self.detached = True
            else:
                self.emit(Notice(att.number, f"cannot detach: {error}; the run stays attached"))
        elif isinstance(item, StopJob):
            if att.stop_cmd is not None or self._stop_cmd is not item:
                att.forced = True  # a second Ctrl-C: cut the channels, the agents kill their ranks
                return
            att.stop_cmd = item
            await self._begin_stop(item.reason)
        elif isinstance(item, RestartGroup):
            if not att.stopping:
                att.restart_requested = True
                await self._begin_stop(
                    f"{item.reason}: the whole group restarts (a rank cannot rejoin a running collective)"
                )
        elif isinstance(item, _Tick):
            assert self._inputs is not None
            self._inputs.tick_pending = False
            await self._timers(att)
        elif isinstance(item, _Alarm):
            await self._failure_stop(att, item.msg)
        else:
            node, msg = item
            if msg is None:
                await self._node_lost(att, node)
            else:
                self.emit(AgentEvent(att.number, msg))
                await self._policy(att, node, msg)

    async def _failure_stop(self, att: Attempt, msg: ProcExited | ProcHung) -> None:
        if att.stopping:
            return
        if isinstance(msg, ProcExited):
            what = msg.signal or f"exit code {msg.exitcode}"
            await self._begin_stop(f"{msg.name} on {msg.node} failed ({what})", trigger=msg.name)
        else:
            await self._begin_stop(f"{msg.name} on {msg.node} is hung ({msg.why})", trigger=msg.name)

    async def _node_lost(self, att: Attempt, node: str) -> None:
        assert self.session is not None
        error = self.session.links[node].error
        self.emit(NodeUpdate(att.number, node, NodeState.LOST, error, time.time_ns()))
        was_done = node in att.done
        att.done.add(node)
        if not att.stopping and not was_done:
            await self._begin_stop(f"lost the node {node}: {error}", trigger=node)

    async def _policy(self, att: Attempt, node: str, msg: Message) -> None:
        now = time.monotonic()
        if isinstance(msg, LogBatch | ProcStarted):
            att.progress[msg.name] = now
        elif isinstance(msg, Metric | MetricBatch):
            att.progress[msg.name] = now
            for m in msg.metrics if isinstance(msg, MetricBatch) else (msg,):
                if m.checksum is not None:
                    divergence = self.replicas.observe(m.name, m.step, m.checksum)
                    if divergence is not None:
                        self.emit(divergence)
        elif isinstance(msg, ProcExited):
            if _alarming(msg):
                await self._failure_stop(att, msg)  # done already where its alarm came first
            if att.workers_done_at is None and self.state.workers_succeeded():
                att.workers_done_at = now
        elif isinstance(msg, ProcHung):
            await self._failure_stop(att, msg)
        elif isinstance(msg, AgentError):
            cur = self.state.attempt
            if (
                cur is not None
                and any(f.kind is FailureKind.AGENT for f in cur.failures)
                and not att.stopping
            ):
                await self._begin_stop(f"{node}: {msg.message}", trigger=node)
        elif isinstance(msg, AllExited):
            att.done.add(node)

    async def _timers(self, att: Attempt) -> None:
        assert self.session is not None
        now = time.monotonic()
        if att.stop_sent_at is not None and now - att.stop_sent_at > self.inv.stop.grace_s + _STOP_CONFIRM_S:
            for name in [p.node.name for p in self.plans if p.node.name not in att.done]:
                att.done.add(name)
                await self.session.cut(name)  # its agent stops its ranks on EOF; a restart reopens it
                self.emit(
                    NodeUpdate(
                        att.number, name, NodeState.LOST, "did not confirm the stop in time", time.time_ns()
                    )
                )
        if att.workers_done_at is not None and not att.sched_stop_sent:
            if now - att.workers_done_at > _SCHEDULER_LINGER_S:
                att.sched_stop_sent = True
                await self.session.broadcast(
                    Stop(reason="scheduler outlived the workers", grace_s=self.inv.stop.grace_s)
                )
        if not att.stopping:
            await self._check_hangs(att, now)

    async def _check_hangs(self, att: Attempt, now: float) -> None:
        """Ask for the state and stack of every rank silent for hang.timeout_s (answered by ProcHung)."""
        assert self.session is not None
        silent: dict[str, list[str]] = {}
        for r in self.state.workers():
            if not r.state.live or r.name in att.inspected or r.exited is not None:
                continue
            if now - att.progress.get(r.name, att.started) > self.hang_timeout_s:
                silent.setdefault(r.node, []).append(r.name)
        for node, names in silent.items():
            att.inspected.update(names)
            reason = f"no progress for {self.hang_timeout_s:g} s"
            await self.session.send(node, Inspect(names=tuple(names), reason=reason))

    async def _begin_stop(self, reason: str, trigger: str | None = None) -> None:
        assert self.session is not None and self._att is not None
        att = self._att
        if att.stop_sent_at is None:
            att.stop_sent_at = time.monotonic()
            self.emit(Stopping(att.number, reason, trigger))
        await self.session.broadcast(Stop(reason=reason, grace_s=self.inv.stop.grace_s))

    # ------------------------------------------------------------ verdict and summary

    def _verdict(self) -> tuple[JobState, int, str]:
        if self._stop_cmd is not None:
            return JobState.INTERRUPTED, self._stop_cmd.exit_code, self._stop_cmd.reason
        att = self.state.attempt
        restarts = len(self.state.attempts) - 1
        after = f" (after {restarts} restart{'s' if restarts != 1 else ''})" if restarts else ""
        if att is not None and att.outcome is AttemptOutcome.SUCCEEDED:
            return JobState.SUCCEEDED, exit_codes.OK, "all ranks finished" + after
        root = self.state.root_cause()
        if root is not None:
            return JobState.FAILED, root.code, describe(root) + after
        return JobState.FAILED, exit_codes.INTERNAL, "ranks ended without a result" + after

    def _result(self, status: JobState, code: int, reason: str, wall_s: float) -> RunResult:
        return run_result(self.state, self.run_id, self.logs_dir, status, code, reason, wall_s, self.bus)

    def _save_traceback(self) -> None:
        with contextlib.suppress(OSError):
            os.makedirs(self.logs_dir, exist_ok=True)
            (self.logs_dir / "engine-error.txt").write_text(traceback.format_exc(), encoding="utf-8")

    def _write_summary(self, result: RunResult) -> None:
        write_summary(self.logs_dir, result)


def run_result(
    state: ClusterState,
    run_id: str,
    logs_dir: Path,
    status: JobState,
    code: int,
    reason: str,
    wall_s: float,
    bus: EventBus,
) -> RunResult:
    """The run's summary from ClusterState (the supervisor's, and an attached console's)."""
    last = state.attempt
    root = state.root_cause() if status is JobState.FAILED and last is not None else None
    return RunResult(
        run_id=run_id,
        status=status,
        exit_code=code,
        reason=reason,
        root_cause=root,
        ranks=state.rank_summaries() if last is not None else (),
        wall_s=wall_s,
        logs_dir=str(logs_dir),
        attempts=state.attempt_summaries(),
        divergent_ranks=tuple(sorted(state.divergent)),
        dropped=bus.dropped(),
    )


def write_summary(logs_dir: Path, result: RunResult) -> None:
    with contextlib.suppress(OSError):
        os.makedirs(logs_dir, exist_ok=True)
        with open(logs_dir / "summary.json", "w", encoding="utf-8") as f:
            json.dump(result.to_json(), f, indent=2)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
