"""The headless view: rank output prefixed on stdout, mscon's own lines and the summary on stderr
(with ``--json -`` the rank output goes to stderr too, and stdout carries only the summary JSON).

Stdout is written by a thread of its own straight to the file descriptor, so a reader that stops
reading never holds up the engine (its lines pile up, bounded, and the excess is counted), and a
closed stdout (``| head``) is reported once through ``on_output_closed`` so the run can end cleanly.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TextIO

from mscon.agent.protocol import (
    SCHEDULER_NAME,
    AgentError,
    Evidence,
    LogBatch,
    Metric,
    MetricBatch,
    NodeSummary,
    ProcExited,
    ProcHung,
    StandbyState,
    is_scheduler,
    rank_of,
)
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptStarted,
    AwaitingOperator,
    Event,
    FetchProgress,
    JobState,
    LogsFetched,
    NodeState,
    NodeUpdate,
    Notice,
    ReplicaDivergence,
    Restarting,
    RunFinished,
    RunResult,
    RunStarted,
    Stopping,
    StragglerCleared,
    StragglerFlagged,
)
from mscon.console.engine.phases import describe_phases
from mscon.console.engine.resume import describe_resume
from mscon.console.engine.root_cause import describe, who_is
from mscon.console.engine.summary import is_stdout, write_summary
from mscon.console.views.plain import printable, size

_PALETTE = ("36", "32", "35", "34", "33", "96", "92", "95", "94", "93")  # ANSI foreground colours
_PENDING_LIMIT = 32 * 2**20  # bytes of rank output held for a stdout that does not keep up


class StdoutWriter:
    """Writes to a file descriptor from a daemon thread; never blocks the caller."""

    def __init__(self, fd: int, on_closed: Callable[[], None] | None = None) -> None:
        self.fd = fd
        self.on_closed = on_closed
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._busy = False
        self.closed = False
        self.dropped_lines = 0
        self.written = 0  # bytes out so far (a drain that sees no progress gives up)
        self.draining = False  # a wait_drained is under way (the bus must not take it for stuck)
        self._thread = threading.Thread(target=self._run, name="stdout", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        with self._cond:
            if self.closed or len(self._buf) + len(data) > _PENDING_LIMIT:
                self.dropped_lines += data.count(b"\n")
                return
            self._buf += data
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._buf:
                    self._busy = False
                    self._cond.notify_all()
                    self._cond.wait()
                data, self._buf = bytes(self._buf), bytearray()
                self._busy = True
            view = memoryview(data)
            try:
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
                    self.written += n
            except OSError as exc:
                with self._cond:
                    self.closed = True
                    self.dropped_lines += bytes(view).count(b"\n") + self._buf.count(b"\n")
                    self._buf.clear()
                    self._busy = False
                    self._cond.notify_all()
                if exc.errno in (errno.EPIPE, errno.EBADF, errno.EINVAL) and self.on_closed is not None:
                    self.on_closed()
                return

    def drain(self, stall_s: float = 0.5) -> bool:
        """Wait until everything written so far is out, as long as stdout keeps taking it; False
        once it took nothing for ``stall_s`` (a reader that stopped reading)."""
        with self._cond:
            while not (self.closed or (not self._buf and not self._busy)):
                before = self.written
                self._cond.wait(stall_s)
                if self.written == before and (self._buf or self._busy):
                    return False
            return True

    async def wait_drained(self, stall_s: float = 0.5) -> bool:
        """``drain`` without holding up the event loop (it waits in a worker thread)."""
        self.draining = True
        try:
            return await asyncio.to_thread(self.drain, stall_s)
        finally:
            self.draining = False


class HeadlessReporter:
    def __init__(
        self,
        out: TextIO | None = None,
        err: TextIO | None = None,
        json_path: Path | None = None,
        quiet_states: bool = False,
        on_output_closed: Callable[[], None] | None = None,
    ) -> None:
        self.err = err or sys.stderr
        # --json -: stdout carries the summary JSON alone, so the rank output joins mscon's lines.
        stream = out or (self.err if is_stdout(json_path) else sys.stdout)
        # Colour the prefixes only for a person at a terminal (and never with NO_COLOR set).
        self.colour = stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        stream.flush()
        self.writer = StdoutWriter(stream.fileno(), on_output_closed)
        self._prefixes: dict[tuple[str, str], str] = {}
        self.json_path = json_path
        self.quiet_states = quiet_states
        self.result: RunResult | None = None
        self._unreachable: list[str] = []  # nodes whose unreachable line was shown
        self._progress = False  # a progress line (no newline yet) is on a terminal's stderr

    def _prefix(self, node: str, name: str) -> str:
        key = (node, name)
        text = self._prefixes.get(key)
        if text is None:
            text = f"[{printable(node)} {printable(name)}] "
            if self.colour:
                text = f"\x1b[{_PALETTE[len(self._prefixes) % len(_PALETTE)]}m{text}\x1b[0m"
            self._prefixes[key] = text
        return text

    def note(self, text: str) -> None:
        try:
            if self._progress:
                self.err.write("\r\x1b[K")  # the progress line gives way
                self._progress = False
            self.err.write(f"mscon: {text}\n")
            self.err.flush()
        except (OSError, ValueError):
            pass  # stderr closed too: nothing left to tell

    def busy(self) -> bool:
        """Draining stdout at the end (for the bus: a busy sink, not a stuck one)."""
        return self.writer.draining

    def handle(self, event: Event) -> Awaitable[None] | None:
        """Show one event; for RunFinished, the awaitable that finishes (the bus awaits it)."""
        if isinstance(event, AgentEvent):
            self._agent(event)
        elif isinstance(event, RunStarted):
            self.note(
                f"run {event.run_id}: {event.world_size} ranks on {len(event.nodes)} node(s) "
                f"({', '.join(map(printable, event.nodes))}); logs -> {event.logs_dir}"
            )
        elif isinstance(event, NodeUpdate):
            if event.state in (NodeState.UNREACHABLE, NodeState.LOST):
                if event.state is NodeState.UNREACHABLE:
                    self._unreachable.append(event.node)
                self.note(f"{printable(event.node)}: {event.state.value}: {printable(event.detail)}")
            elif not self.quiet_states and event.state is NodeState.READY:
                self.note(f"{printable(event.node)}: agent up ({printable(event.detail)})")
        elif isinstance(event, ReplicaDivergence):
            self.note(
                f"WARNING: replicas diverged at step {event.step}: {', '.join(event.ranks)} "
                f"differ from the others' parameters ({event.majority}); check seeds and data masks"
            )
        elif isinstance(event, Notice):
            self.note(event.text)
        elif isinstance(event, StragglerFlagged):
            self.note(
                f"{_who(event.name, event.node)} is a straggler from step {event.step}: "
                f"{event.step_time_s:.3g} s/step, {event.step_time_s / event.median_s:.2f}x the other "
                f"ranks' median of {event.median_s:.3g} s (threshold {event.factor:g}x)"
            )
        elif isinstance(event, StragglerCleared):
            self.note(
                f"{_who(event.name, event.node)} is no longer a straggler at step {event.step}: "
                f"{event.step_time_s:.3g} s/step, the other ranks' median {event.median_s:.3g} s"
            )
        elif isinstance(event, Stopping):
            self.note(f"stopping every rank on every node: {printable(event.reason)}")
        elif isinstance(event, AttemptEnded):
            if event.outcome is AttemptOutcome.FAILED:
                self.note(f"attempt {event.attempt} failed: {printable(describe(event.root_cause))}")
        elif isinstance(event, AttemptStarted):
            if event.warm:
                self.note(f"attempt {event.attempt} starts warm: its processes are the standby cluster's")
        elif isinstance(event, Restarting):
            self.note(
                f"restarting the whole group as attempt {event.attempt} in {event.backoff_s:g} s "
                f"({event.restarts_left} restart(s) left after this): {printable(event.reason)}"
            )
        elif isinstance(event, AwaitingOperator):
            wait = "" if event.wait_s is None else f" for {event.wait_s:g} s"
            self.note(
                f"{printable(event.reason)}; waiting{wait} for the operator: mscon attach, then r restarts "
                "the whole group, q ends the run"
            )
        elif isinstance(event, LogsFetched):
            if event.error:
                self.note(f"{printable(event.node)}: could not fetch logs: {printable(event.error)}")
        elif isinstance(event, FetchProgress):
            self._fetch_progress(event)
        elif isinstance(event, RunFinished):
            self.result = event.result
            return self.finish(event.result)
        return None

    def _fetch_progress(self, event: FetchProgress) -> None:
        """One line, rewritten in place: only for a person at a terminal (a log file gets the
        summary's total instead)."""
        try:
            if not self.err.isatty():
                return
            self.err.write(
                f"\rmscon: fetching logs: {size(event.bytes)} from {event.nodes} node(s), "
                f"{event.nodes_done} done, {event.seconds:.0f} s\x1b[K"
            )
            self.err.flush()
            self._progress = True
        except (OSError, ValueError):
            pass

    def _agent(self, event: AgentEvent) -> None:
        msg = event.msg
        if isinstance(msg, LogBatch):
            if msg.lines:
                prefix = self._prefix(msg.node, msg.name)
                # One write per batch of whole lines: output of two ranks never mixes inside a
                # line. Joined as text and encoded once, not line by line: the ingest hot path.
                text = prefix + ("\n" + prefix).join(msg.lines) + "\n"
                self.writer.write(text.encode("utf-8", "replace"))
        elif isinstance(msg, ProcExited):
            if not msg.ok and not msg.stopped_by_agent:
                self.note(f"{_who(msg.name, msg.node)} failed: {msg.describe()}")
        elif isinstance(msg, ProcHung):
            why = "stopped by a signal" if msg.why == "stopped" else "makes no progress"
            self.note(f"{_who(msg.name, msg.node)} {why} (process state {msg.state})")
        elif isinstance(msg, Evidence):
            self.note(
                f"MindSpore names rank(s) {', '.join(map(str, msg.ranks))}: {printable(msg.text)[:300]}"
            )
        elif isinstance(msg, MetricBatch | NodeSummary):
            for m in msg.metrics:
                if m.profile_dir:
                    self.note(f"{_who(m.name, m.node)}: profiler output in {m.profile_dir}")
        elif isinstance(msg, Metric):
            if msg.profile_dir:
                self.note(f"{_who(msg.name, msg.node)}: profiler output in {msg.profile_dir}")
        elif isinstance(msg, AgentError):
            self.note(f"{printable(msg.node)}: agent: {printable(msg.message)}")
        elif isinstance(msg, StandbyState) and msg.joining:
            pass  # spares started: their word once joined (or lost) is the news
        elif isinstance(msg, StandbyState) and msg.attempt == 0:  # the one a last run kept (Adopt)
            if msg.ready:
                what = "taken: the standby the last run of this job kept (the launch skips the join)"
            else:
                what = f"not taken ({printable(msg.why)}): attempt 0 starts cold"
            self.note(f"{printable(msg.node)}: kept standby {what}")
        elif isinstance(msg, StandbyState):
            if msg.ready:
                what = "ready (its spares joined their own MindSpore cluster: a restart skips the join)"
            else:
                what = f"lost: {printable(msg.why)}; a restart would be cold"
            self.note(f"{printable(msg.node)}: standby for attempt {msg.attempt} {what}")

    async def finish(self, result: RunResult) -> None:
        """The summary on stderr once stdout has taken the rank output (or stopped taking it)."""
        if not await self.writer.wait_drained() and not self.writer.closed:
            self.note("stdout is not being read; the rest of the rank output is in the logs")
        if self.writer.dropped_lines and not self.writer.closed:  # a closed stdout was said already
            self.note(
                f"{self.writer.dropped_lines} line(s) of rank output not shown (stdout closed or "
                "too slow); every line is in the fetched logs"
            )
        try:
            self.err.write(format_summary(result, said_unreachable=self._unreachable))
            self.err.flush()
        except (OSError, ValueError):
            pass
        if self.json_path is not None:
            try:
                write_summary(self.json_path, result)
            except OSError as exc:
                self.note(f"cannot write {self.json_path}: {exc.strerror or exc}")


def _who(name: str, node: str) -> str:
    return printable(who_is(name, rank_of(name), node))


def format_summary(result: RunResult, said_unreachable: Sequence[str] = ()) -> str:
    """The run's summary; ``said_unreachable``: the nodes whose unreachable line (error, transport
    and remedy) was shown already, so the summary names them instead of repeating their errors."""
    status = f"{result.status.value} in {result.wall_s:.1f} s"
    reason = printable(result.reason)
    if result.status is JobState.UNREACHABLE and said_unreachable:
        reason = f"{', '.join(map(printable, said_unreachable))} (see above)"
    head = f"mscon: run {result.run_id} {status}: {reason}"
    lines = ["", head]
    if result.ranks:  # none when no node could be reached
        lines += _rank_table(result)
    if len(result.attempts) > 1:
        lines.append("")
        lines.append("attempts:")
        for a in result.attempts:
            what = describe(a.root_cause) if a.root_cause is not None else a.reason
            lines.append(f"  {a.attempt}: {a.outcome.value} after {a.wall_s:.1f} s: {printable(what)}")
            if a.root_cause is not None and a.root_cause is not result.root_cause:
                lines += ["    " + printable(t) for t in _last_lines(a.root_cause)[-3:]]
        # Where each restart's ranks started (the first attempt starts at the beginning).
        lines += [
            f"attempt {a.attempt}: {printable(describe_resume(a.resume))}"
            for a in result.attempts
            if a.attempt and a.resume
        ]
    timed = [f"  {a.attempt}: {describe_phases(a.phases)}" for a in result.attempts if a.phases is not None]
    if timed:
        lines.append("")
        lines.append("start-up, per attempt (each milestone when the last node or rank reached it):")
        lines += timed
    rc = result.root_cause
    if rc is not None:
        lines.append("")
        lines.append(f"Root cause (first failure, by the clock of the {rc.clock}): {printable(describe(rc))}")
        if rc.evidence:
            lines.append(f"  MindSpore says: {printable(rc.evidence)[:500]}")
        if rc.stack:
            lines.append("  where it was stuck:")
            lines.extend("    " + printable(s) for s in rc.stack.splitlines()[-15:])
        shown = _last_lines(rc)
        if shown:
            lines.append("  last lines:")
            lines.extend("    " + printable(line) for line in shown)
    if result.divergent_ranks:
        lines.append(f"replicas that diverged: {', '.join(result.divergent_ranks)}")
    if result.stragglers:
        lines.append("stragglers (median step time when flagged, against the other ranks' median):")
        for s in result.stragglers:
            ratio = s.step_time_s / s.median_s if s.median_s > 0 else float("inf")
            again = f", flagged {s.flagged} times" if s.flagged > 1 else ""
            lines.append(
                f"  attempt {s.attempt}: {_who(s.name, s.node)}: {s.step_time_s:.3g} s/step, "
                f"{ratio:.2f}x the others' {s.median_s:.3g} s{again}{', then caught up' if s.cleared else ''}"
            )
    for sink, n in result.dropped:
        lines.append(f"the {sink} view skipped {n} metric update(s) to keep up")
    lines.append(f"logs: {result.logs_dir}{_fetched(result)}")
    lines.append(f"exit code: {result.exit_code}")
    return "\n".join(lines) + "\n"


def _fetched(result: RunResult) -> str:
    """`` (12.0 MiB fetched in 3.1 s)``: what came back of the nodes' run folders."""
    if not result.fetched:
        return ""
    total = sum(f.bytes for f in result.fetched)
    slowest = max(f.seconds for f in result.fetched)
    return f" ({size(total)} fetched in {slowest:.1f} s)"


def _last_lines(rc: object) -> list[str]:
    tb = getattr(rc, "traceback", None)
    return tb.splitlines()[-12:] if tb else list(getattr(rc, "tail", ())[-10:])


def _rank_table(result: RunResult) -> list[str]:
    header = ("node", "rank", "status", "last step", "last loss", "wall s", "")
    rows = [header]
    for r in sorted(result.ranks, key=lambda r: (is_scheduler(r.rank), r.rank)):
        rows.append(
            (
                printable(r.node),
                SCHEDULER_NAME if is_scheduler(r.rank) else str(r.rank),
                r.status,
                "-" if r.last_step is None else str(r.last_step),
                "-" if r.last_loss is None else f"{r.last_loss:.4f}",
                "-" if r.wall_s is None else f"{r.wall_s:.1f}",
                r.role,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
