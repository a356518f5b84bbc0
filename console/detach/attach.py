"""Attaching to a detached run: the same events, state and views as a run the console started.

The ``Attacher`` reaches every node's agent through a relay (``agent/detached/relay.py``), asks each for its
journal and the log lines this console has not printed yet (``Attach``), rebuilds ClusterState
from the journals, merged attempt by attempt, and then follows the run live. Policy stays with the
node-0 coordinator: the operator's stop and restart go to it as ``RunCommand``. Leaving (Ctrl-C, or
the run's end) never stops the run; ``mscon stop`` does, by attaching and sending the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import getpass
import os
import socket
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from mscon.agent.layout import LOGS_DIR
from mscon.agent.policy import Status, Verdict, attempt_outcome, standby_complete
from mscon.agent.protocol import (
    AgentError,
    Attach,
    Coord,
    CoordKind,
    JournalDone,
    Journaled,
    Message,
    Metric,
    MetricBatch,
    ReplayDone,
    RunCommand,
    StandbyPhase,
    StandbyState,
    from_dict,
    message_class,
    standby_port,
)
from mscon.console.config.inventory import Inventory
from mscon.console.detach.record import DetachRecord, write_record
from mscon.console.engine import exit_codes
from mscon.console.engine.bus import EventBus
from mscon.console.engine.commands import Command, DetachRun, RestartGroup, StopJob
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptStarted,
    AwaitingOperator,
    Event,
    JobState,
    LinesShown,
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
from mscon.console.engine.plan import build_plan, run_started
from mscon.console.engine.root_cause import describe
from mscon.console.engine.session import ClusterSession, TransportFactory
from mscon.console.engine.state import ClusterState
from mscon.console.engine.stragglers import StragglerPolicy, StragglerWatch
from mscon.console.engine.summary import run_result, summary_file, write_summary
from mscon.console.engine.verdict import attempt_reason, final_verdict
from mscon.console.transport import make_transport

E = TypeVar("E", bound=enum.Enum)


def _started_warm(msg: Message) -> bool:
    return isinstance(msg, Coord) and msg.kind == CoordKind.ATTEMPT_STARTED and msg.warm


def _known(kind: type[E], value: str, default: E) -> E:
    """The policy's words, as the coordinator journaled them (a newer agent's unknown word: default)."""
    try:
        return kind(value)  # type: ignore[call-arg]
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class AttachOptions:
    run_id: str
    logs_root: Path = Path(LOGS_DIR)
    record: DetachRecord | None = None  # what the detaching console printed
    follow: bool = True  # False: replay and leave (mscon logs without -f)
    read_only: bool = False
    stop: bool = False  # mscon stop: attach, stop the run, wait for its end
    accept_new_host_keys: bool = False
    # An operator at a live console: a run waiting for one (failed, no budget) is followed while
    # it waits. Otherwise the attach reports the failure and leaves the run waiting.
    interactive: bool = False


class AttachRefused(Exception):
    """The node refused the attach (another console steers the run, no such run): one line."""


class Attacher:
    def __init__(
        self,
        inventory: Inventory,
        options: AttachOptions,
        bus: EventBus | None = None,
        transport_factory: TransportFactory = make_transport,
    ) -> None:
        self.inv = inventory
        self.options = options
        self.run_id = options.run_id
        self.bus = bus or EventBus()
        self.state = ClusterState()
        self.stragglers = StragglerWatch(StragglerPolicy(), self.state)  # as the supervisor's, default policy
        self._standby: dict[str, StandbyPhase] = {}  # node -> its standby for attempt _standby_for
        self._standby_for = -1
        self.logs_dir = (options.logs_root / self.run_id).resolve()
        self.bus.errors_to(self.logs_dir)
        rec = options.record
        script = rec.script if rec is not None else inventory.job.script
        args = rec.args if rec is not None else inventory.job.args
        self.plans = build_plan(inventory, script, args)
        self._factory = transport_factory
        self._inbox: asyncio.Queue[tuple[str, Message | None] | Command] = asyncio.Queue()
        self._attempt = -1
        self._ended: JobState | None = None
        self._end_reason = ""
        self._leave: str | None = None
        self._waiting: str | None = None  # the run waits for an operator: why
        self._stop_sent = False
        self.session: ClusterSession | None = None

    # ------------------------------------------------------------ commands and events

    def submit(self, cmd: Command) -> None:
        self._inbox.put_nowait(cmd)

    def emit(self, ev: Event) -> None:
        self.state.apply(ev)
        self.bus.publish(ev)

    @property
    def attempt_no(self) -> int:
        return max(self._attempt, 0)

    # ------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        t0 = time.monotonic()
        self.emit(
            run_started(self.inv, self.plans, self.run_id, str(self.logs_dir), self.inv.restart.max_restarts)
        )
        session = self.session = ClusterSession(
            self.inv,
            self.plans,
            self.run_id,
            self.emit,
            self._inbox,
            self.options.accept_new_host_keys,
            self._factory,
            attach=True,
            attempt_of=lambda: self.attempt_no,
        )
        status, code, reason = JobState.ERROR, exit_codes.INTERNAL, "internal error"
        try:
            status, code, reason = await self._run(session)
        finally:
            if self._ended is not None:
                await session.close(self.inv.stop.grace_s)
                await session.fetch_logs(self.logs_dir)
            else:
                await session.release()
                self._save_progress()
            await session.disconnect()
        result = run_result(
            self.state, self.run_id, self.logs_dir, status, code, reason, time.monotonic() - t0, self.bus
        )
        if self._ended is not None:
            with contextlib.suppress(OSError):  # a full disk: the summary is still shown
                write_summary(summary_file(self.logs_dir), result)
        self.emit(RunFinished(self.attempt_no, result))
        await self.bus.close()
        return result

    async def _run(self, session: ClusterSession) -> tuple[JobState, int, str]:
        errors = await session.open()
        if errors:
            return JobState.UNREACHABLE, exit_codes.UNREACHABLE, "; ".join(errors)
        names = [p.node.name for p in self.plans]
        rec = self.options.record
        who = f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"
        request = Attach(
            log_from=dict(rec.log_seq) if rec is not None else {},
            log_attempt=rec.attempt if rec is not None else -1,
            read_only=self.options.read_only,
            follow=self.options.follow,
            console=who,
        )
        await session.broadcast(request)
        try:
            buffered = await self._rebuild(names, request)
        except AttachRefused as exc:
            return JobState.ERROR, exit_codes.USAGE, str(exc)
        # Live from here: first what arrived while the journals were merged, in order per node.
        # A node is open until its end is taken off the inbox, not while its link says so: a
        # channel closes (mscon logs: right after the replay) before the console has read it all.
        replaying = set(names)
        open_nodes = set(names)
        for node in names:
            for msg in buffered[node]:
                if msg is None:
                    open_nodes.discard(node)
                    replaying.discard(node)
                else:
                    self._live(node, msg, replaying)
        if self.options.stop:
            await self._command(StopJob("stopped by mscon stop"))
        while open_nodes and self._leave is None:
            if not self.options.follow and not replaying:
                break
            if self._waiting and not replaying and not self.options.interactive and not self._stop_sent:
                break
            item = await self._inbox.get()
            if isinstance(item, tuple):
                node, msg = item
                if msg is None:
                    open_nodes.discard(node)
                    replaying.discard(node)
                else:
                    self._live(node, msg, replaying)
            else:
                await self._command(item)
        if self._ended is not None:
            return self._verdict()
        if self._waiting and self.options.follow:
            root = self.state.root_cause()
            return (
                JobState.FAILED,
                root.code if root is not None else exit_codes.INTERNAL,
                f"{describe(root) if root is not None else self._waiting}; the run waits for an operator: "
                f"mscon attach {self.run_id} (in a terminal), then r restarts the group; "
                f"mscon stop {self.run_id} ends it",
            )
        if self._leave is not None:
            return (
                JobState.DETACHED,
                exit_codes.OK,
                f"{self._leave}: the run goes on (mscon attach {self.run_id})",
            )
        if not self.options.follow:
            return JobState.DETACHED, exit_codes.OK, "logs printed; the run goes on"
        return JobState.FAILED, exit_codes.UNREACHABLE, "the run's agents went away before it ended"

    async def _rebuild(self, names: list[str], request: Attach) -> dict[str, list[Message | None]]:
        """Collect every node's journal, then replay them merged: attempt by attempt, each
        attempt's messages in the order of the agents' clocks. Returns what came after each
        node's journal (log replay, live messages; None: the node's channel ended), to be applied
        next."""
        journals: dict[str, list[tuple[int, Message]]] = {n: [] for n in names}
        done: dict[str, JournalDone] = {}
        after: dict[str, list[Message | None]] = defaultdict(list)
        retried: set[str] = set()
        while len(done) < len(names):
            item = await self._inbox.get()
            if not isinstance(item, tuple):
                self._requeue_later(item)
                continue
            node, msg = item
            if msg is None:
                if node not in done:
                    assert self.session is not None
                    link = self.session.links[node]
                    if node in retried:
                        raise AttachRefused(f"{node}: the relay ended early: {link.error}")
                    # A run that ends as we attach: its agent took our connection and closed it on
                    # its way out. Once more, on a new relay: it finds the run's files, or its agent.
                    retried.add(node)
                    journals[node] = []  # nothing of it is applied before every journal is in
                    error = await self.session.reopen(node)
                    if error is not None or not await self.session.send(node, request):
                        raise AttachRefused(f"{node}: the relay ended early: {error or link.error}")
                    continue
                after[node].append(None)
                continue
            if node in done:
                after[node].append(msg)
            elif isinstance(msg, Journaled):
                decoded = _decode(msg.msg)
                if decoded is not None:
                    journals[node].append((msg.attempt, decoded))
            elif isinstance(msg, JournalDone):
                done[node] = msg
            elif isinstance(msg, AgentError):
                raise AttachRefused(f"{node}: {msg.message}")
        self._merge(journals)
        current = max(d.attempt for d in done.values())
        if self._attempt < current:
            self._start_attempt(current, 0)
        if not any(d.live for d in done.values()) and self._ended is None:
            self._ended = JobState.FAILED
            self._end_reason = "no agent runs this run any more, and it recorded no end (its agents died?)"
        return after

    def _requeue_later(self, cmd: Command) -> None:
        asyncio.get_running_loop().call_later(0.05, self._inbox.put_nowait, cmd)

    def _merge(self, journals: dict[str, list[tuple[int, Message]]]) -> None:
        by_attempt: dict[int, list[tuple[int, int, str, Message]]] = defaultdict(list)
        for node, entries in journals.items():
            for order, (attempt, msg) in enumerate(entries):
                by_attempt[attempt].append((_ts(msg), order, node, msg))
        for attempt in sorted(by_attempt):
            entries = sorted(by_attempt[attempt], key=lambda e: (e[0], e[2], e[1]))
            first_ts = entries[0][0] if entries else 0
            if attempt > self._attempt:  # the coordinator's word comes first by its clock, or not
                warm = any(_started_warm(msg) for _, _, _, msg in entries)
                self._start_attempt(attempt, first_ts, warm)
            for _, _, node, msg in entries:
                self._apply(node, msg)
        if self.state.attempt is not None and self.state.attempt.outcome is None and self._ended is not None:
            self._end_attempt_from_state()

    def _start_attempt(self, attempt: int, ts_ns: int, warm: bool = False) -> None:
        if self._attempt >= 0 and self.state.attempt is not None and self.state.attempt.outcome is None:
            self._end_attempt_from_state()  # ended under the console, before the detach
        self._attempt = attempt
        refs = tuple(RankRef(s.name, p.node.name, s.rank) for p in self.plans for s in p.procs)
        base = self.inv.scheduler.port
        port = standby_port(base, attempt) if warm else base
        self.emit(AttemptStarted(attempt, refs, "", port, ts_ns or time.time_ns(), warm))
        rec = self.options.record
        if rec is not None and rec.attempt == attempt:
            # The lines the detaching console printed are not replayed: count from there.
            self.emit(LinesShown(attempt, tuple(rec.log_seq.items())))

    def _end_attempt_from_state(self) -> None:
        workers = frozenset(r.name for r in self.state.workers())
        ok = {r.name for r in self.state.workers() if r.exited is not None and r.exited.ok}
        outcome = attempt_outcome(workers, ok)  # the policy's rule
        reason, root = attempt_reason(outcome, "", self.state)
        self.emit(AttemptEnded(self._attempt, outcome, reason, root, time.time_ns()))

    def _standby_said(self, msg: StandbyState) -> None:
        """What the coordinator's policy makes of a node's standby, by its rule (it journals no
        word of its own on it)."""
        if self._standby_for != msg.attempt:
            self._standby, self._standby_for = {}, msg.attempt
        self._standby[msg.node] = msg.state
        warm = standby_complete(self._standby, tuple(p.node.name for p in self.plans))
        self.emit(StandbyUpdated(msg.attempt, msg.node, msg.ready, warm, msg.why))

    def _apply(self, node: str, msg: Message) -> None:
        """One message of the run, journaled or live: console events as the supervisor emits them."""
        if not isinstance(msg, Coord):
            self.emit(AgentEvent(self.attempt_no, msg))
            if isinstance(msg, StandbyState) and msg.attempt > self._attempt and not msg.joining:
                self._standby_said(msg)
            if isinstance(msg, Metric | MetricBatch):
                for ev in self.stragglers.observe(self.attempt_no, msg):
                    self.emit(ev)
            return
        if msg.kind == CoordKind.STOPPING:
            self.emit(Stopping(msg.attempt, msg.reason, msg.trigger, msg.ts_ns))
        elif msg.kind == CoordKind.NODE_LOST and msg.trigger:
            self.emit(NodeUpdate(msg.attempt, msg.trigger, NodeState.LOST, msg.reason, msg.ts_ns))
        elif msg.kind == CoordKind.ATTEMPT_ENDED:
            outcome = _known(AttemptOutcome, msg.outcome, AttemptOutcome.FAILED)
            root = self.state.root_cause() if outcome is AttemptOutcome.FAILED else None
            reason = describe(root) if root is not None else msg.reason or msg.outcome
            self.emit(AttemptEnded(msg.attempt, outcome, reason, root, msg.ts_ns))
        elif msg.kind == CoordKind.RESTARTING:
            self.emit(Restarting(msg.attempt + 1, msg.reason, msg.backoff_s, msg.restarts_left))
        elif msg.kind == CoordKind.ATTEMPT_STARTED:
            self._waiting = None
            if msg.attempt > self._attempt:
                self._start_attempt(msg.attempt, msg.ts_ns, msg.warm)
        elif msg.kind == CoordKind.AWAITING_OPERATOR:
            root = self.state.root_cause()
            reason = f"{msg.reason}: {describe(root)}" if root is not None else msg.reason
            self.emit(AwaitingOperator(msg.attempt, reason, msg.wait_s or None))
            self._waiting = reason
        elif msg.kind == CoordKind.RUN_ENDED:
            self._ended = _known(JobState, msg.outcome, JobState.FAILED)
            self._end_reason = msg.reason

    def _live(self, node: str, msg: Message, replaying: set[str]) -> None:
        if isinstance(msg, ReplayDone):
            replaying.discard(node)
        elif isinstance(msg, AgentError):
            self.emit(Notice(self.attempt_no, f"{node}: {msg.message}"))
        else:
            self._apply(node, msg)

    def closing_command(self) -> Command:
        """What a console that closes without a choice sends: leaving, never stopping the run."""
        return DetachRun("the console was closed")

    async def _command(self, cmd: Command) -> None:
        assert self.session is not None
        if isinstance(cmd, DetachRun):
            self._leave = cmd.reason  # leaving an attached run never stops it
            return
        if self.options.read_only:
            self.emit(Notice(self.attempt_no, "read-only: commands are refused"))
            return
        lead = self.plans[0].node.name
        if isinstance(cmd, StopJob):
            if self._stop_sent:
                self._leave = "stop not confirmed; left the run"
                return
            self._stop_sent = True
            await self.session.send(lead, RunCommand(action="stop", reason=cmd.reason))
        elif isinstance(cmd, RestartGroup):
            await self.session.send(lead, RunCommand(action="restart", reason=cmd.reason))

    def _save_progress(self) -> None:
        """Leaving a running run: the next attach starts where this console's output stopped."""
        att = self.state.attempt
        if att is None or self.options.read_only:
            return
        rec = self.options.record
        record = DetachRecord(
            run_id=self.run_id,
            inventory=str(Path(self.inv.path).resolve()),
            script=rec.script if rec is not None else self.inv.job.script,
            args=rec.args if rec is not None else tuple(self.inv.job.args),
            attempt=att.number,
            log_seq={r.name: r.next_seq for r in self.state.ranks.values()},
            detached_at=time.time(),
        )
        with contextlib.suppress(OSError):
            write_record(self.logs_dir, record)

    def _verdict(self) -> tuple[JobState, int, str]:
        """The coordinator's end of the run in the words a console's run ends with: one mapping
        (``verdict.final_verdict``), whichever host's policy ended it."""
        status = _known(Status, (self._ended or JobState.FAILED).value, Status.FAILED)
        v = final_verdict(Verdict(status, self._end_reason or None), self.state)
        return v.status, v.exit_code, v.reason


def _decode(raw: dict) -> Message | None:
    try:
        return from_dict(message_class(str(raw.get("type"))), {k: v for k, v in raw.items() if k != "type"})
    except (ValueError, TypeError):
        return None


def _ts(msg: Message) -> int:
    ts = getattr(msg, "ts_ns", None)
    return int(ts) if isinstance(ts, int) else 0
