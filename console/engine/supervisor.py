"""The console's host of the run's policy: it connects, resolves the scheduler, runs preflight,
then turns everything it hears (commands, clock ticks, agent messages: one queue, inputs.py) into
the policy's inputs and carries out the actions it returns (agent/policy.py decides: stop, restart,
wait for the operator, end). ClusterState records; the root cause is ClusterState's to compute.
No UI code here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from mscon.agent import layout
from mscon.agent import policy as policy_mod
from mscon.agent.policy import RunPolicy
from mscon.agent.protocol import (
    Inspect,
    LogBatch,
    Message,
    Metric,
    MetricBatch,
    NodeSummary,
    ProcSpec,
    Start,
    Stop,
    standby_port,
)
from mscon.console.config.inventory import Inventory
from mscon.console.detach.handover import hand_over
from mscon.console.detach.record import record_detach
from mscon.console.engine import exit_codes, run_ids
from mscon.console.engine.adopt import ask_to_adopt
from mscon.console.engine.aio import cancel_and_wait
from mscon.console.engine.bus import EventBus
from mscon.console.engine.clock import Clock, MonotonicClock
from mscon.console.engine.commands import Command, DetachRun, RestartGroup, StopJob
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptStarted,
    AwaitingOperator,
    Event,
    JobState,
    NodeState,
    NodeUpdate,
    Notice,
    RankRef,
    Restarting,
    RunFinished,
    RunResult,
    StandbyUpdated,
    Stopping,
)
from mscon.console.engine.inputs import AGENT_BACKLOG, TICK, Alarm, Input, Inputs, Tick
from mscon.console.engine.job_kinds import attempt_argv, restart_note
from mscon.console.engine.lines_wanted import EVERY_METRIC_UP_TO, SLOWEST_TICK_S, LinesWanted, SummaryPace
from mscon.console.engine.plan import build_plan, policy_config, run_started, with_scheduler
from mscon.console.engine.replicas import ReplicaWatch
from mscon.console.engine.run_options import RunOptions
from mscon.console.engine.sched_address import scheduler_address
from mscon.console.engine.session import ClusterSession, TransportFactory
from mscon.console.engine.state import ClusterState
from mscon.console.engine.stragglers import StragglerPolicy, StragglerWatch
from mscon.console.engine.summary import run_result, save_traceback, summary_file, write_summary
from mscon.console.engine.verdict import (
    RunVerdict,
    attempt_reason,
    awaiting_reason,
    final_verdict,
    restart_reason,
)
from mscon.console.preflight.runner import JobView
from mscon.console.transport import NodeUnreachable, make_transport

T = TypeVar("T")

_TICK_S = 0.25


class Supervisor:
    def __init__(
        self,
        inventory: Inventory,
        options: RunOptions | None = None,
        bus: EventBus | None = None,
        transport_factory: TransportFactory = make_transport,
        clock: Clock | None = None,
    ):
        self._factory = transport_factory
        self.clock: Clock = clock or MonotonicClock()  # every run rule's time (clock.py)
        self.inv = inventory
        self.options = options or RunOptions()
        self.bus = bus or EventBus()
        self.state = ClusterState()
        self.run_id = self.options.run_id or run_ids.first_free_here(
            run_ids.generated_run_id(), self.options.logs_root
        )
        self.logs_dir = (self.options.logs_root / self.run_id).resolve()
        self.bus.errors_to(self.logs_dir)  # a view that raises: its traceback in console.err there
        self.script = self.options.script or inventory.job.script
        self.args = self.options.args if self.options.args is not None else inventory.job.args
        self.plans = build_plan(inventory, self.script, self.args)
        mr = self.options.max_restarts
        self.max_restarts = mr if mr is not None else inventory.restart.max_restarts
        self.backoff_s = inventory.restart.backoff_s
        self.hang_timeout_s = inventory.hang.timeout_s
        self._inputs: Inputs | None = None
        self._early: list[Command] = []
        self.policy: RunPolicy | None = None  # from the first attempt on
        self._later: list[Command] = []  # commands the policy takes once it runs
        self.session: ClusterSession | None = None
        self._stop_cmd: StopJob | None = None
        self.replicas = ReplicaWatch(inventory.world_size)
        self.stragglers = StragglerWatch(
            StragglerPolicy(self.options.straggler_factor, self.options.straggler_window), self.state
        )
        self._sched = ""
        self.detached = False
        self.lines = LinesWanted()  # which ranks' lines the views want (the agents' Subscribe)
        self._lines_seen: dict[str, int] = {}  # rank -> lines its node counted (NodeSummary)
        self._resubscribe: asyncio.Task[None] | None = None
        # Slower summaries while the console is behind (half its inbox's bound queued).
        hang_s = self.hang_timeout_s or 0.0
        self.pace = SummaryPace(
            len(self.plans), behind=AGENT_BACKLOG // 2, slowest=hang_s / 3 if hang_s > 0 else SLOWEST_TICK_S
        )

    # ------------------------------------------------------------ commands and events

    def submit(self, cmd: Command) -> None:
        """Queue a command (call on the loop's thread; signal handlers and the UI do)."""
        if isinstance(cmd, StopJob) and self._stop_cmd is None:
            self._stop_cmd = cmd
        if self._inputs is None:
            self._early.append(cmd)
        else:
            self._inputs.put_nowait(cmd)

    def want_lines(self, view: str, ranks: frozenset[int] | None) -> None:
        """A view shows the lines of ``ranks`` (None: every rank's): the agents are told at the
        next Start, and at once while the run is up. Call on the loop's thread."""
        if self.lines.want(view, ranks) and self.session is not None:
            self._subscribe_soon()

    def _subscribe_soon(self) -> None:
        if self._resubscribe is not None:
            self._resubscribe.cancel()  # the new one tells every node the newest wish
        loop = asyncio.get_running_loop()
        self._resubscribe = loop.create_task(self._subscribe_all(), name="subscribe")

    def _subscription(self, plan_index: int) -> Message:
        plan = self.plans[plan_index]
        every = self.inv.world_size <= EVERY_METRIC_UP_TO
        return self.lines.subscription((s.rank for s in plan.procs), self.pace.tick_s, every)

    async def _subscribe_all(self) -> None:
        session = self.session
        if session is None:
            return
        # Most nodes are told the same (no rank of theirs in view): each Subscribe encoded once.
        groups: dict[Message, list[str]] = {}
        for i, p in enumerate(self.plans):
            if session.links[p.node.name].open:
                groups.setdefault(self._subscription(i), []).append(p.node.name)
        await asyncio.gather(*(session.broadcast(msg, nodes) for msg, nodes in groups.items()))

    def closing_command(self) -> Command:
        """What a console that closes without a choice sends: a run it started dies with it."""
        return StopJob("the console was closed")

    def emit(self, ev: Event) -> None:
        self.state.apply(ev)
        self.bus.publish(ev)

    @property
    def attempt_no(self) -> int:
        att = self.state.attempt
        return att.number if att is not None else 0

    # ------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        t0 = time.monotonic()
        self._inputs = Inputs(self.clock)
        for cmd in self._early:
            self._inputs.put_nowait(cmd)
        self.emit(run_started(self.inv, self.plans, self.run_id, str(self.logs_dir), self.max_restarts))
        session = self.session = ClusterSession(
            self.inv,
            self.plans,
            self.run_id,
            self.emit,
            self._inputs,
            self.options.accept_new_host_keys,
            self._factory,
            attempt_of=lambda: self.attempt_no,
            launches=self.options.preflight is None or not self.options.preflight.options.checks_only,
        )
        ticker = asyncio.get_running_loop().create_task(self._ticker(), name="ticker")
        verdict = RunVerdict(JobState.ERROR, exit_codes.INTERNAL, "internal error")
        try:
            verdict = await self._run(session)
        except Exception as exc:  # a bug: one line for the user, the traceback in the run folder
            verdict = RunVerdict(
                JobState.ERROR,
                exit_codes.INTERNAL,
                f"internal error: {type(exc).__name__}: {exc} (traceback: {self.logs_dir}/engine-error.txt)",
            )
            save_traceback(self.logs_dir)
        finally:
            await cancel_and_wait(ticker)
            if self._resubscribe is not None:
                await cancel_and_wait(self._resubscribe)
            if self.detached:
                # the ranks run on: nothing to stop, logs are not final yet
                record_detach(self.logs_dir, self.run_id, self.inv.path, self.script, self.args, self.state)
            else:
                # A run that ended by itself leaves a standby for the next run of the job (an
                # interrupted one leaves nothing: Ctrl-C means the nodes are wanted back).
                ended = verdict.status in (JobState.SUCCEEDED, JobState.FAILED)
                keep_s = self.inv.restart.keep_warm_s if ended and self._keeps_warm() else 0.0
                await session.close(self.inv.stop.grace_s, keep_s)
                await session.fetch_logs(self.logs_dir, self.options.fetch)
            await session.disconnect()
        result = self._result(verdict, time.monotonic() - t0)
        self._write_summary(result)
        self.emit(RunFinished(self.attempt_no, result))
        await self.bus.close()
        return result

    async def _ticker(self) -> None:
        assert self._inputs is not None and self.session is not None
        last_ping = self.clock.now()
        while True:
            await self.clock.sleep(_TICK_S)
            if not self._inputs.tick_pending:
                self._inputs.tick_pending = True
                self._inputs.put_nowait(TICK)
            if self.lines.any and self.pace.observe(self._inputs.queued, self.clock.now()):
                self._subscribe_soon()  # behind (or caught up again): the summaries' new pace
            if self.clock.now() - last_ping >= self.inv.ssh.keepalive_s:
                last_ping = self.clock.now()
                await self.session.ping()

    async def _run(self, session: ClusterSession) -> RunVerdict:
        errors = await self._unless_stopped(session.open())
        if self._stop_cmd is not None:
            return self._interrupted()
        if errors:
            if self.options.preflight is not None:
                self.options.preflight.unreachable(self, session)
            return RunVerdict(JobState.UNREACHABLE, exit_codes.UNREACHABLE, "; ".join(errors))
        if self.options.run_id is None:  # a generated id never takes over an earlier run's folders
            claimed = await self._claim_run_id(session)
            if isinstance(claimed, RunVerdict):
                return claimed
        found = await self._unless_stopped(scheduler_address(self.inv, self.plans, session))
        if found is None or self._stop_cmd is not None:
            return self._interrupted()
        if found.ip is None:
            return RunVerdict(JobState.FAILED, found.exit_code, found.error)
        self._sched = sched = found.ip
        if self.options.preflight is not None:
            verdict = await self._unless_stopped(self.options.preflight.run(self, session, sched))
            if verdict is None or self._stop_cmd is not None:
                return self._interrupted()
            if not verdict.proceed:
                return RunVerdict(verdict.status, verdict.exit_code, verdict.reason)
        return await self._drive(session)

    def _interrupted(self) -> RunVerdict:
        stop = self._stop_cmd or StopJob()
        return RunVerdict(JobState.INTERRUPTED, stop.exit_code, stop.reason)

    async def _unless_stopped(self, aw: Awaitable[T], limit_s: float | None = None) -> T | None:
        """Await ``aw`` (connecting, resolving, preflight, reopening a node) while serving the input
        queue; None when a StopJob (or ``limit_s``) came first. Attempts are driven by ``_drive``."""
        assert self._inputs is not None
        return await self._inputs.serve_while(aw, self._meanwhile, limit_s)

    def _meanwhile(self, item: Input) -> bool:
        """An input while no policy runs; True: a stop, the wait ends."""
        self._observe(item)
        if isinstance(item, DetachRun):
            self.emit(Notice(self.attempt_no, "cannot detach now: no attempt is running"))
        elif isinstance(item, StopJob):
            return True
        elif isinstance(item, RestartGroup):
            self._later.append(item)  # for the policy, once it runs (a restart during a reopen)
        return False

    def _link_error(self, node: str) -> str:
        return self.session.links[node].error if self.session is not None else ""

    # ------------------------------------------------------------ attempts, driven by the policy

    def _watchdog_s(self) -> float:
        return policy_mod.watchdog_s(self.inv.ssh.keepalive_s)

    def _argv(self, spec: ProcSpec, run_dir: str, number: int) -> tuple[str, ...]:
        """The attempt's command line, as its kind of job has it (job_kinds.py)."""
        folder = layout.checkpoint_folder(run_dir)
        resume = self.inv.job.resume_args
        return attempt_argv(spec.argv, self.script, number, self._restart_may_come(), folder, resume)

    def _restart_may_come(self) -> bool:
        """``policy.restart_may_come`` for this run."""
        return policy_mod.restart_may_come(self.max_restarts, self.options.operator_wait_s)

    def _restart_may_follow(self) -> bool:
        """``policy.restart_may_follow``, with the policy's budget left once it runs."""
        left = self.policy.restarts_left if self.policy is not None else self.max_restarts
        return policy_mod.restart_may_follow(left, self.options.operator_wait_s)

    async def _drive(self, session: ClusterSession) -> RunVerdict:
        """Feed the policy what happens and carry out what it decides, until it ends the run."""
        assert self._inputs is not None
        hang_s, wait_s = self.hang_timeout_s, self.options.operator_wait_s
        config = policy_config(
            self.plans, self.max_restarts, self.backoff_s, self.inv.stop.grace_s, hang_s, wait_s
        )
        policy = self.policy = RunPolicy(config)
        pending: deque[policy_mod.Action] = deque()
        if self._keeps_warm():  # the policy waits for their word before attempt 0
            asked = await ask_to_adopt(
                session, self.plans, lambda i: self._start_msg(session, i, 0, self._sched)
            )
            pending.extend(policy.step(policy_mod.AwaitAdoption(asked, self.clock.now())))
        pending.extend(policy.step(policy_mod.Begin(self.clock.now())))
        for cmd in self._later:
            self._inputs.put_nowait(cmd)
        self._later.clear()
        while True:
            while pending:
                act = pending.popleft()
                if isinstance(act, policy_mod.EndRun):
                    return final_verdict(act.verdict, self.state)
                done = await self._carry_out(session, act)
                if isinstance(done, RunVerdict):
                    return done
                for ev in done:
                    pending.extend(self._step(ev))
            if self.detached:
                return RunVerdict(
                    JobState.DETACHED,
                    exit_codes.OK,
                    f"detached: the run goes on (mscon attach {self.run_id})",
                )
            item = await self._inputs.get()
            for ev in await self._take(session, item):
                pending.extend(self._step(ev))

    def _keeps_warm(self) -> bool:
        return self.options.owns_nodes and self.inv.restart.keeps_warm(self.inv.device_target)

    def _step(self, ev: policy_mod.Input) -> list[policy_mod.Action]:
        """The policy takes one input; what it makes of a standby is an event (whether a restart
        would be warm is the operator's to know before pressing r)."""
        policy = self.policy
        assert policy is not None
        nxt = policy.attempt + 1
        # Asked of a lost node only: this runs for every input.
        was_warm = isinstance(ev, policy_mod.NodeLost) and policy.warm_for(nxt)
        actions = policy.step(ev)
        if isinstance(ev, policy_mod.StandbyChanged) and ev.attempt > policy.attempt and not ev.joining:
            self.emit(StandbyUpdated(ev.attempt, ev.node, ev.ready, policy.warm_for(ev.attempt), ev.why))
        elif isinstance(ev, policy_mod.NodeLost) and was_warm and policy.attempt + 1 == nxt:
            # its spares went with its agent
            self.emit(StandbyUpdated(nxt, ev.node, False, policy.warm_for(nxt), "its agent is gone"))
        return actions

    def _observe(self, item: Input) -> None:
        """What an input means to the console's own picture, whoever takes it (the policy, or a
        wait before it runs): agent messages and lost links become events, a tick is taken."""
        assert self._inputs is not None
        if isinstance(item, Tick):
            self._inputs.tick_pending = False
        elif isinstance(item, tuple):
            node, msg = item
            if msg is None:
                self.emit(
                    NodeUpdate(self.attempt_no, node, NodeState.LOST, self._link_error(node), time.time_ns())
                )
            else:
                self.emit(AgentEvent(self.attempt_no, msg))

    async def _take(self, session: ClusterSession, item: Input) -> list[policy_mod.Input]:
        """One input as the policy's events (and the console's own events on the way)."""
        assert self.policy is not None
        self._observe(item)
        now = self.clock.now()
        if isinstance(item, Tick):
            return [policy_mod.Tick(now)]
        if isinstance(item, StopJob):
            return [policy_mod.StopRequested(item.reason, item.exit_code, now)]
        if isinstance(item, RestartGroup):
            return [policy_mod.RestartRequested(item.reason, now)]
        if isinstance(item, DetachRun):
            await self._detach_now(session)
            return []
        if isinstance(item, Alarm):
            return self._policy(item.node, item.msg, now)
        node, msg = item
        if msg is None:
            return [policy_mod.NodeLost(node, self._link_error(node), now)]
        return self._policy(node, msg, now)

    def _policy(self, node: str, msg: Message, now: float) -> list[policy_mod.Input]:
        """An agent's message as the policy's event; progress and replica checks on the way."""
        assert self.policy is not None
        if isinstance(msg, LogBatch):
            return [policy_mod.RankProgress(msg.name, now)]
        elif isinstance(msg, NodeSummary):
            seen = self._lines_seen
            moved: list[policy_mod.Input] = []
            stepped = {m.name for m in msg.metrics}  # their StepReport is progress too: one input each
            for c in msg.counts:  # a line read on the node is progress, sent or not
                if c.lines > seen.get(c.name, 0):
                    seen[c.name] = c.lines
                    if c.name not in stepped:
                        moved.append(policy_mod.RankProgress(c.name, now))
            return moved + self._policy_metrics(msg, now)
        elif isinstance(msg, Metric | MetricBatch):
            return self._policy_metrics(msg, now)
        else:
            taken = policy_mod.from_message(node, msg, now)
            return [taken] if taken is not None else []
        return []

    def _policy_metrics(self, msg: Metric | MetricBatch | NodeSummary, now: float) -> list[policy_mod.Input]:
        """Steps for the hang rule, checksums for the replica check, step times for stragglers."""
        assert self.policy is not None
        metrics = (msg,) if isinstance(msg, Metric) else msg.metrics
        if not metrics:
            return []
        reports: list[policy_mod.Input] = []
        for m in metrics:
            reports.append(policy_mod.StepReport(m.name, m.ts or time.time(), now))
            if m.checksum is not None:
                divergence = self.replicas.observe(m.name, m.step, m.checksum)
                if divergence is not None:
                    self.emit(divergence)
        # A summary holds one metric of each of several ranks: the straggler watch takes them one
        # by one (a MetricBatch, one rank's, in one go).
        for one in metrics if isinstance(msg, NodeSummary) else (msg,):
            for ev in self.stragglers.observe(self.attempt_no, one):
                self.emit(ev)
        return reports

    async def _carry_out(
        self, session: ClusterSession, act: policy_mod.Action
    ) -> list[policy_mod.Input] | RunVerdict:
        """One decision of the policy, done; what it brought back (a node lost on the way)."""
        assert self.policy is not None
        number = self.attempt_no  # the policy may be a step ahead (the actions of one step in a row)
        if isinstance(act, policy_mod.StartAttempt):
            return await self._start_attempt(session, act.attempt, act.warm)
        if isinstance(act, policy_mod.StopAll):
            if act.announce:
                self.emit(Stopping(number, act.reason, act.trigger, time.time_ns()))
            await session.broadcast(Stop(reason=act.reason, grace_s=self.inv.stop.grace_s))
        elif isinstance(act, policy_mod.StopScheduler):
            await session.broadcast(Stop(reason=act.reason, grace_s=self.inv.stop.grace_s))
        elif isinstance(act, policy_mod.Inspect):
            await session.send(act.node, Inspect(names=act.names, reason=act.reason, silent_s=act.silent_s))
        elif isinstance(act, policy_mod.CutOff):
            for name in act.nodes:
                await session.cut(name)  # its agent stops its ranks on EOF; a restart reopens it
                self.emit(NodeUpdate(number, name, NodeState.LOST, act.why, time.time_ns()))
        elif isinstance(act, policy_mod.RestartRefused):
            self.emit(Notice(number, f"cannot restart now: {act.reason}"))
        elif isinstance(act, policy_mod.Force):
            await session.abort()
        elif isinstance(act, policy_mod.AttemptOver):
            reason, root = attempt_reason(act.outcome, act.reason, self.state)
            self.emit(AttemptEnded(act.attempt, act.outcome, reason, root, time.time_ns()))
        elif isinstance(act, policy_mod.Restarting):
            why = restart_reason(act.why, self.state)
            why += restart_note(self.script, self._restart_may_come(), tuple(self.args))
            self.emit(Restarting(act.attempt, why, act.backoff_s, act.restarts_left))
        elif isinstance(act, policy_mod.AwaitOperator):
            self.emit(AwaitingOperator(act.attempt, awaiting_reason(act.attempt, self.state), act.wait_s))
        return []

    async def _claim_run_id(self, session: ClusterSession) -> RunVerdict | None:
        """The generated id, or its first suffix no node and no local folder holds (a Slurm job id
        that came round again): the run takes it before anything is written under it."""
        try:
            claimed = await session.claim_free_run_id(self.options.logs_root)
        except NodeUnreachable as exc:
            return RunVerdict(JobState.UNREACHABLE, exit_codes.UNREACHABLE, str(exc))
        except run_ids.RunIdTaken as exc:
            return RunVerdict(JobState.ERROR, exit_codes.USAGE, str(exc))
        if claimed != self.run_id:
            held = f"run id {self.run_id} is held by an earlier run: this run is {claimed}"
            self.emit(Notice(self.attempt_no, held))
            self.run_id = claimed
            before, self.logs_dir = self.logs_dir, (self.options.logs_root / claimed).resolve()
            with contextlib.suppress(OSError):  # what it recorded so far (open files follow the rename)
                if before.exists() and not self.logs_dir.exists():
                    before.rename(self.logs_dir)
            self.bus.errors_to(self.logs_dir)
        return None

    async def _start_attempt(
        self, session: ClusterSession, number: int, warm: bool = False
    ) -> list[policy_mod.Input] | RunVerdict:
        assert self._inputs is not None
        if number > 0:
            for name in [n for n, link in session.links.items() if not link.open]:
                if self._stop_cmd is None:
                    # Failed (its link.error says why): a lost node, below, the policy's to weigh.
                    await self._unless_stopped(session.reopen(name))
            if self._stop_cmd is not None:
                return RunVerdict(JobState.INTERRUPTED, self._stop_cmd.exit_code, self._stop_cmd.reason)
        self.replicas = ReplicaWatch(self.inv.world_size, number)
        self._lines_seen = {}  # each attempt's ranks count their lines from 0
        refs = tuple(RankRef(s.name, p.node.name, s.rank) for p in self.plans for s in p.procs)
        port = standby_port(self.inv.scheduler.port, number) if warm else self.inv.scheduler.port
        self.emit(AttemptStarted(number, refs, self._sched, port, time.time_ns(), warm))
        lost: list[policy_mod.Input] = []

        async def start(plan_index: int) -> None:
            name = self.plans[plan_index].node.name
            link = session.links[name]
            msg = self._start_msg(session, plan_index, number, self._sched, warm)
            if self.lines.any:  # ahead of the Start, on the same channel: its first lines obey it
                await session.send(name, self._subscription(plan_index))
            if await session.send(name, msg):
                self.emit(NodeUpdate(number, name, NodeState.RUNNING, f"attempt {number}", time.time_ns()))
            elif not link.open:  # lost before its ranks could start
                self.emit(NodeUpdate(number, name, NodeState.LOST, link.error, time.time_ns()))
                lost.append(policy_mod.NodeLost(name, link.error, self.clock.now()))

        await asyncio.gather(*(start(i) for i in range(len(self.plans))))
        if self.options.detach and number == 0:
            self._inputs.put_nowait(DetachRun("--detach"))
        return lost

    def _start_msg(
        self, session: ClusterSession, plan_index: int, number: int, sched: str, warm: bool = False
    ) -> Start:
        plan = self.plans[plan_index]
        name = plan.node.name
        run_dir = session.run_dir(name)
        procs = tuple(
            replace(with_scheduler(s, sched), argv=self._argv(s, run_dir, number)) for s in plan.procs
        )
        link = session.links[name]
        cwd = layout.work_folder(run_dir) if link.transport.syncs_workdir else str(self.inv.job.workdir)
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
            spares=self.options.spares and self._restart_may_follow(),
            join_standby=self.inv.restart.standby_joins(self.inv.device_target),
            warm=warm,
            keep_runs=self.inv.retention.keep_runs,
            drop_kept=self.options.owns_nodes,
        )

    # ------------------------------------------------------------ detach

    async def _detach_now(self, session: ClusterSession) -> None:
        assert self.policy is not None
        nxt = self.policy.attempt + 1
        starts = [self._start_msg(session, i, nxt, self._sched) for i in range(len(self.plans))]
        keep_s = self.inv.restart.keep_warm_s if self._keeps_warm() else 0.0
        error = await hand_over(session, self.policy, starts, self._sched, self.hang_timeout_s, keep_s)
        if error is None:
            self.detached = True
            await self._let_go(session)
        else:
            self.emit(Notice(self.attempt_no, f"cannot detach: {error}; the run stays attached"))

    async def _let_go(self, session: ClusterSession) -> None:
        """Close our channels and take in what they delivered before closing (the lines we print
        are the lines a later attach does not replay)."""
        await session.release()
        assert self._inputs is not None
        while not self._inputs.empty():
            item = self._inputs.get_nowait()
            if isinstance(item, tuple) and item[1] is not None:
                self.emit(AgentEvent(self.attempt_no, item[1]))

    # ------------------------------------------------------------ verdict and summary

    def _result(self, v: RunVerdict, wall_s: float) -> RunResult:
        return run_result(
            self.state, self.run_id, self.logs_dir, v.status, v.exit_code, v.reason, wall_s, self.bus
        )

    def _write_summary(self, result: RunResult) -> None:
        with contextlib.suppress(OSError):
            write_summary(summary_file(self.logs_dir), result)

    # ------------------------------------------------------------ what preflight sees (RunHost)

    @property
    def job(self) -> JobView:
        return JobView(
            inv=self.inv,
            plans=self.plans,
            script=self.script,
            args=tuple(self.args),
            args_given=self.options.args is not None,
            run_id=self.run_id,
            accept_new_host_keys=self.options.accept_new_host_keys,
        )

    def nested_run(self, inv: Inventory, run_id: str, logs_root: Path, bus: EventBus) -> Supervisor:
        """A run of its own with this one's connection settings (preflight's collective smoke test)."""
        options = RunOptions(
            run_id=run_id,
            logs_root=logs_root,
            accept_new_host_keys=self.options.accept_new_host_keys,
            max_restarts=0,
            owns_nodes=False,
        )
        return Supervisor(inv, options, bus=bus, clock=self.clock)
