"""The node agent: takes commands as JSON lines on stdin, reports as JSON lines on stdout.

Policy: the console owns restarts and cross-node decisions; the agent owns its node's processes.
When a rank fails, the agent stops its node-local siblings at once (the console stops the other
nodes). When stdin closes (the console or its SSH channel is gone), the agent stops everything
and exits, so a crashed console leaves nothing behind, unless the console detached the run first
(``Detach``): then the agent becomes a daemon on a Unix socket and node 0's agent takes over the
run's policy (``detached.py``).

Every lifecycle message is also kept in the run folder's journal (``journal.py``), so a console
that attaches later learns the whole run.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

from . import procs as procmod
from . import protocol as P
from .checks.mesh import MeshListener, probe_peer
from .evidence import blame
from .journal import Journal, RunStatus, write_state
from .layout import CACHE_DIR, attempt_folder
from .metrics import LineParser
from .metrics import from_record as metric_from_record
from .outbox import Outbox
from .policy import DEFAULT_GRACE_S
from .relay import hello
from .streams import read_lines
from .tail import FileTail, LineMetrics, extract_traceback, parse_metrics_line

if TYPE_CHECKING:
    from .detached import DetachedRun
    from .devices import DeviceSampler

# Imported where first used, not here: detaching (detached, coord, daemon), device sampling, the
# workdir archive (tarfile) and argparse cost tens of milliseconds at every agent start, and an
# agent that only runs checks, lists runs or relays an attach needs none of them.

_FINAL_WRITE_S = 30.0  # at exit, how long the last messages may take to reach a slow console
_TAIL_KEEP = 200  # lines kept per process for the exit report
_BATCH_MAX = 500  # lines per LogBatch message
_STATE_CHECK_S = 0.2  # how often process states are read (a SIGSTOPped rank is seen within ~0.5 s)
_STOPPED_CONFIRM_S = 0.3  # state T this long is a stop, not a debugger's brief attach


class ConsoleGone(Exception):
    pass


class Watched:
    """Per-process streaming state."""

    def __init__(self, proc: procmod.Proc) -> None:
        self.proc = proc
        # Each attempt has its own folder, so both files are read from their start.
        self.log = FileTail(proc.log_path)
        self.metrics = FileTail(proc.metrics_path)
        self.seq = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=_TAIL_KEEP)
        self.has_metrics_file = False
        self.progress_ns = time.time_ns()  # last log line or metric read (start counts as progress)
        self.stopped_since: float | None = None  # monotonic time state T was first seen
        self.hung_reported = False
        # A ProcHung waiting for its py-spy stack (taken by a thread): its exit is reported after it.
        self.hung_pending: P.ProcHung | None = None
        self.drained = False  # its log read to the end after its exit (held back while the console is behind)
        self._parser: LineParser | None = None

    def parser(self, node: str, line_metrics: LineMetrics) -> LineParser:
        """This process's parser of printed metrics (it keeps the last TimeMonitor step time)."""
        if self._parser is None or self._parser.line_metrics is not line_metrics:
            self._parser = LineParser(node, self.proc.spec.name, self.proc.spec.rank, line_metrics)
        return self._parser


class Agent:
    def __init__(self, node: str, out=None) -> None:  # noqa: ANN001
        self.node = node
        self.outbox = Outbox(out or sys.stdout)  # never blocks: a slow console must not stall the loop
        self.inbox: queue.Queue = queue.Queue()
        self.watched: list[Watched] = []
        self.start_cmd: P.Start | None = None
        self.last_heard = time.monotonic()
        self.line_metrics = LineMetrics()
        self.devices: DeviceSampler | None = None  # started with the first Start (it knows the target)
        self.all_exited_sent = False
        self.failed = False
        self.stopping: procmod.GroupStop | None = None  # a stop under way, advanced by tick()
        self._last_flush = 0.0
        self._last_telemetry = 0.0
        self._last_state_check = 0.0
        self._checks: queue.Queue | None = None  # preflight requests, run one at a time by a thread
        self._mesh: MeshListener | None = None
        self.journal: Journal | None = None
        self.run_dir = ""
        self.detached: DetachedRun | None = None
        self.to_console = True  # False once a detached agent's console left: output goes to clients
        self.exit_now = False
        self._state_extra: dict = {}

    # ------------------------------------------------------------ I/O

    def send(self, msg: P.Message) -> None:
        if self.journal is not None and msg.journaled:
            self.journal.add(self.start_cmd.attempt if self.start_cmd else 0, msg.to_dict())
        line = P.encode(msg)
        if self.detached is not None:
            self.detached.observe(msg)  # the coordinator's policy, a follower's report
            self.detached.broadcast(line)  # consoles attached on the socket
        if not self.to_console:
            return
        if not self.outbox.put(line, msg.streamed):
            if self.detached is not None:
                return  # the console went while detaching: the daemon goes on
            raise ConsoleGone()

    def _read_stdin(self) -> None:
        # Raw reads on fd 0, not sys.stdin: a thread blocked inside sys.stdin holds its lock and
        # would deadlock the interpreter's shutdown.
        read_lines(lambda n: os.read(0, n), lambda line: self.inbox.put(("console", None, line)))
        self.inbox.put(("console", None, None))  # EOF

    # ------------------------------------------------------------ main loop

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.outbox.close(_FINAL_WRITE_S)

    def _run(self) -> int:
        threading.Thread(target=self._read_stdin, name="stdin", daemon=True).start()
        try:
            self.send(hello(self.node, _ssh_server_addr()))
            while True:
                try:
                    source, obj, line = self.inbox.get(timeout=0.02)
                except queue.Empty:
                    source, obj, line = "", None, ""
                if source == "console" and line is None:  # console gone
                    if self.detached is not None:
                        self.to_console = False
                        self.detached.console_left()
                    else:
                        self.stop_and_wait("console closed the connection", self._grace())
                        self._final_state()
                        return 0
                elif source == "console":
                    self.last_heard = time.monotonic()
                    if not self.handle(line):
                        self._final_state()
                        return 0
                elif source == "stack":
                    self._hung_stack(obj, line)
                elif source and self.detached is not None:
                    self._guarded(self.detached.handle, source, obj, line)
                elif self._console_silent():
                    self.stop_and_wait(
                        "no word from the console for %gs (network partition?)" % self._watchdog(),
                        self._grace(),
                        report=False,
                    )
                    self._final_state()
                    return 0
                self.tick()
                if self.detached is not None:
                    self._guarded(self.detached.tick)
                if self.exit_now:
                    if self.detached is not None:
                        self.detached.close()
                    return 0
        except ConsoleGone:
            self.stop_and_wait("console output closed", self._grace(), report=False)
            return 0
        except KeyboardInterrupt:
            self.stop_and_wait("agent interrupted", self._grace(), report=False)
            return 130

    def _guarded(self, fn, *args) -> None:  # noqa: ANN001
        """A detached run's extras (clients, links, policy) must never take the ranks down with
        the agent: a bug there is written to agent.err and the run goes on."""
        try:
            fn(*args)
        except ConsoleGone:
            raise
        except Exception:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            sys.stderr.flush()

    def _watchdog(self) -> float:
        return self.start_cmd.watchdog_s if self.start_cmd else 0.0

    def _console_silent(self) -> bool:
        """A partition leaves the channel open on this side: without this, ranks would run on."""
        if self.detached is not None:
            return False  # no console pings a detached run (followers watch their coordinator)
        limit = self._watchdog()
        return limit > 0 and time.monotonic() - self.last_heard > limit

    def _grace(self) -> float:
        return self.start_cmd.grace_s if self.start_cmd else DEFAULT_GRACE_S

    def handle(self, line: str) -> bool:
        """Carry out one command; False when the agent should exit."""
        try:
            msg = P.decode(line)
        except P.ProtocolError as exc:
            self.send(P.AgentError(node=self.node, message=str(exc)))
            return True
        if isinstance(msg, P.Start):
            self.start(msg)
        elif isinstance(msg, P.Stop):
            self.stop(msg.reason, msg.grace_s)
        elif isinstance(msg, P.Shutdown):
            self.stop_and_wait("shutdown", self._grace())
            return False
        elif isinstance(msg, P.Inspect):
            for w in self.watched:
                if w.proc.spec.name in msg.names and w.proc.alive:
                    self._report_hung(w, "no progress")
        elif isinstance(msg, P.Resolve):
            self.send(_resolve(self.node, msg.host))
        elif isinstance(msg, P.RunChecks):
            self._run_checks(msg)
        elif isinstance(msg, P.MeshListen):
            self._mesh_listen(msg)
        elif isinstance(msg, P.MeshProbe):
            # Connects can take up to timeout_s each: answered from a thread, pings keep flowing.
            threading.Thread(target=self._mesh_probe, args=(msg,), name="mesh-probe", daemon=True).start()
        elif isinstance(msg, P.MeshClose):
            if self._mesh is not None:
                self._mesh.close()
                self._mesh = None
        elif isinstance(msg, P.Detach):
            self._detach(msg)
        return True

    # ------------------------------------------------------------ detach

    def _detach(self, msg: P.Detach) -> None:
        if msg.role == "cancel":
            if self.detached is not None:
                self.detached.close()
                self.detached = None
                self._save_state()
            self.send(P.Detached(node=self.node))
            return
        if self.start_cmd is None or self.journal is None:
            self.send(P.Detached(node=self.node, error="no run to detach (nothing was started)"))
            return
        if self.detached is not None:
            self.send(P.Detached(node=self.node, socket=self.detached.socket_path, error="already detached"))
            return
        try:
            from .detached import DetachedRun

            run = DetachedRun(self, msg)
        except Exception as exc:  # noqa: BLE001 - told to the console, which stays attached
            self.send(P.Detached(node=self.node, error="cannot detach: %s" % exc))
            return
        self.detached = run
        self._state_extra["detached"] = True
        self._state_extra["console"] = msg.console
        self._save_state()
        self.send(P.Detached(node=self.node, socket=run.socket_path, coordinator_port=run.coordinator_port))

    def _save_state(self, **changes: object) -> None:
        """state.json: what `mscon ls` and a later attach read."""
        self._state_extra.update(changes)
        if not self.run_dir or self.start_cmd is None:
            return
        state = {
            "run_id": self.start_cmd.run_id,
            "node": self.node,
            "attempt": self.start_cmd.attempt,
            "pid": os.getpid(),
            "status": RunStatus.RUNNING,
            "procs": [
                {"name": w.proc.spec.name, "rank": w.proc.spec.rank, "pid": w.proc.popen.pid}
                for w in self.watched
            ],
            "started": self._state_extra.get("started", time.time()),
            "log_seq": {w.proc.spec.name: w.seq for w in self.watched},  # lines each log has streamed
        }
        state.update(self._state_extra)
        try:
            write_state(self.run_dir, state)
        except OSError:
            pass  # a full disk must not stop the run; ls shows the last state it could write

    def _final_state(self) -> None:
        """The node's own verdict as the agent leaves (a detached coordinator records the run's)."""
        if not self.run_dir or self._state_extra.get("status", RunStatus.RUNNING) != RunStatus.RUNNING:
            return
        procs = [w.proc for w in self.watched]
        if any(p.returncode not in (0, None) and not p.stop_sent for p in procs):
            status = RunStatus.FAILED
        elif procs and all(p.returncode == 0 for p in procs):
            status = RunStatus.SUCCEEDED
        else:
            status = RunStatus.INTERRUPTED
        self._save_state(status=status)

    # ------------------------------------------------------------ commands

    def start(self, cmd: P.Start) -> None:
        if self.start_cmd is not None and any(w.proc.alive for w in self.watched):
            self.send(P.AgentError(node=self.node, message="start refused: processes still running"))
            return
        if self.stopping is not None:  # none of its processes is alive (see above): its last sweep
            self.stopping.step(time.monotonic())
            self.stopping = None  # its deadlines must not apply to the new ranks
        self.start_cmd = cmd
        self.line_metrics = LineMetrics(cmd.metrics_pattern)
        if self.devices is None:
            from .devices import DeviceSampler

            target = cmd.procs[0].env.get("DEVICE_TARGET", "") if cmd.procs else ""
            self.devices = DeviceSampler(target)
        self.watched = []
        self.all_exited_sent = False
        self.failed = False
        log_dir = attempt_folder(cmd.run_dir, cmd.attempt)
        try:
            if os.path.isdir(log_dir) and os.listdir(log_dir):
                # Never mix two runs' logs: a reused run id would make old lines look new.
                raise OSError("%s already holds logs of an earlier run with this run id" % log_dir)
            os.makedirs(log_dir, exist_ok=True)
            if self.journal is None:
                os.chmod(cmd.run_dir, 0o700)  # logs, journal and (detached) the socket: the user's only
                self.run_dir = cmd.run_dir
                self.journal = Journal(cmd.run_dir)
                self._state_extra["started"] = time.time()
            if cmd.workdir_archive:
                _unpack(cmd.workdir_archive, cmd.cwd)
            if not os.path.isdir(cmd.cwd):
                raise OSError("working directory %s does not exist" % cmd.cwd)
        except (OSError, UnsafeArchive) as exc:
            self.send(P.AgentError(node=self.node, message="cannot prepare run: %s" % exc))
            self.send(P.AllExited(node=self.node, ts_ns=time.time_ns()))
            self.all_exited_sent = True
            return
        base_env = dict(os.environ)
        base_env["MSCON_ATTEMPT"] = str(cmd.attempt)  # as torchrun's TORCHELASTIC_RESTART_COUNT
        # Scheduler first: workers retry their connection to it, but it should be up early.
        for spec in sorted(cmd.procs, key=lambda s: not s.is_scheduler):
            try:
                proc = procmod.launch(spec, cmd.cwd, log_dir, base_env)
            except OSError as exc:
                self.send(P.AgentError(node=self.node, message="cannot start %s: %s" % (spec.name, exc)))
                self.failed = True
                if any(w.proc.alive for w in self.watched):
                    self.stop("launch failed", cmd.grace_s)  # tick() sends AllExited once they are gone
                else:
                    self.send(P.AllExited(node=self.node, ts_ns=time.time_ns()))
                    self.all_exited_sent = True
                return
            w = Watched(proc)
            self.watched.append(w)
            self.send(
                P.ProcStarted(
                    node=self.node,
                    name=spec.name,
                    rank=spec.rank,
                    pid=proc.popen.pid,
                    ts_ns=time.time_ns(),
                    log_path=proc.log_path,
                )
            )
        self._save_state()

    def stop(self, reason: str, grace_s: float) -> None:
        """Stop every process of the node without waiting: TERM now, KILL at the grace deadline.
        tick() advances the stop and reports each exit as it comes, so the loop keeps serving
        (pings, other nodes' orders, log lines) while the ranks take their grace."""
        if not any(w.proc.alive for w in self.watched):
            return
        if self.stopping is None:
            self.stopping = procmod.GroupStop()
        self.stopping.add([w.proc for w in self.watched], grace_s, time.monotonic())

    def stop_and_wait(self, reason: str, grace_s: float, report: bool = True) -> None:
        """Stop every process and block until they are gone: only as the agent leaves, when the
        loop has nothing left to serve."""
        self.stop(reason, grace_s)
        if self.stopping is None:
            return
        by_proc = {id(w.proc): w for w in self.watched}

        def on_reap(p: procmod.Proc) -> None:
            if report:
                self._report_exit(by_proc[id(p)])

        stopping, self.stopping = self.stopping, None
        stopping.wait(on_reap)
        if report:
            for w in self.watched:
                if not w.proc.reported and not w.proc.alive:
                    self._report_exit(w)

    # ------------------------------------------------------------ supervision

    def tick(self) -> None:
        now = time.monotonic()
        exited = [w for w in self.watched if w.proc.poll()]
        if self.stopping is not None and self.stopping.step(now):  # after the reaping above
            self.stopping = None
        if not self.watched or self.all_exited_sent:
            return
        interval = self.start_cmd.flush_interval_s if self.start_cmd else 0.1
        if exited or now - self._last_flush >= interval:
            self._last_flush = now
            for w in self.watched:
                if not w.proc.reported:
                    self._flush(w)
                elif not w.drained:  # exited while its lines were held back: they follow its report
                    w.drained = self._flush(w, final=True)
        for w in exited:
            if w.hung_pending is None:  # else once its ProcHung has gone (_hung_stack)
                self._report_exit(w)
            if w.proc.returncode != 0 and not w.proc.stop_sent and not self.failed:
                # Root-cause candidate: stop the node-local siblings now, not after a round trip.
                self.failed = True
                self.stop("%s failed" % w.proc.spec.name, self._grace())
        if now - self._last_telemetry >= 1.0:
            self._last_telemetry = now
            self._telemetry()
        if now - self._last_state_check >= _STATE_CHECK_S:
            self._last_state_check = now
            self._check_stopped(now)
            if self.detached is not None and self.detached.hang_timeout_s > 0:
                self._check_silent(self.detached.hang_timeout_s)
        if all(w.proc.reported and w.drained for w in self.watched):
            self.send(P.AllExited(node=self.node, ts_ns=time.time_ns()))
            self.all_exited_sent = True

    def _flush(self, w: Watched, final: bool = False) -> bool:
        """Send the process's new lines (LogBatch) and metrics (MetricBatch); False when they are
        held back: the console is behind, and they stay in the files until it has caught up."""
        if not self.outbox.has_room():
            return False
        # Structured metrics win over parsing the log: look for the file before parsing lines.
        if not w.has_metrics_file and os.path.exists(w.proc.metrics_path):
            w.has_metrics_file = True
        lines = w.log.read_lines(final=final)
        if lines:
            w.progress_ns = time.time_ns()
        parsed: list[P.Metric] = []
        for start in range(0, len(lines), _BATCH_MAX):
            chunk = lines[start : start + _BATCH_MAX]
            w.recent.extend(chunk)
            spec = w.proc.spec
            self.send(
                P.LogBatch(
                    node=self.node,
                    name=spec.name,
                    rank=spec.rank,
                    seq=w.seq,
                    lines=tuple(chunk),
                    ts_ns=time.time_ns(),
                )
            )
            w.seq += len(chunk)
            # One substring test of the whole chunk spares the per-line tests of most chunks:
            # these are blame()'s own first tests (agent/evidence.py).
            text = "\n".join(chunk)
            if "imed out" in text or "emote" in text or "eer rank" in text:
                for line in chunk:
                    self._evidence(w, line)
            if not w.has_metrics_file:
                for line in self.line_metrics.candidates(chunk, text):
                    metric = w.parser(self.node, self.line_metrics).parse(line)
                    if metric is not None:
                        parsed.append(metric)
        self._flush_metrics(w, final, parsed)
        return True

    def _evidence(self, w: Watched, line: str) -> None:
        found = blame(line)
        if found is None:
            return
        spec = w.proc.spec
        self.send(
            P.Evidence(
                node=self.node,
                name=spec.name,
                rank=spec.rank,
                ranks=tuple(found.ranks),
                kind=found.kind,
                text=found.text,
                ts_ns=time.time_ns(),
            )
        )

    def _check_stopped(self, now: float) -> None:
        """A rank in state T makes no progress and never will on its own: report it unasked."""
        for w in self.watched:
            if not w.proc.alive or w.hung_reported or w.proc.stop_sent:
                continue
            if procmod.proc_state(w.proc.popen.pid) in ("T", "t"):
                if w.stopped_since is None:
                    w.stopped_since = now
                elif now - w.stopped_since >= _STOPPED_CONFIRM_S:
                    self._report_hung(w, "stopped")
            else:
                w.stopped_since = None

    def _check_silent(self, limit_s: float) -> None:
        """Detached, nobody sends Inspect: a rank silent for hang.timeout_s is reported here."""
        cutoff = time.time_ns() - int(limit_s * 1e9)
        for w in self.watched:
            if w.proc.alive and not w.hung_reported and not w.proc.stop_sent and w.progress_ns < cutoff:
                if not w.proc.spec.is_scheduler:  # the scheduler is quiet by nature
                    self._report_hung(w, "no progress")

    def _report_hung(self, w: Watched, why: str) -> None:
        """Report a rank that makes no progress, with its Python stack: py-spy takes up to 10 s,
        so it runs in a thread and the report goes out when the stack comes in (_hung_stack)."""
        if w.hung_pending is not None:
            return  # a report is on its way already
        w.hung_reported = True
        pid = w.proc.popen.pid
        self._flush(w)
        spec = w.proc.spec
        w.hung_pending = P.ProcHung(
            node=self.node,
            name=spec.name,
            rank=spec.rank,
            pid=pid,
            why=why,
            state=procmod.describe_state(procmod.proc_state(pid)),
            since_ns=w.progress_ns,
            ts_ns=time.time_ns(),
            wchan=procmod.wchan(pid),
            tail=tuple(list(w.recent)[-20:]),
        )

        def take_stack() -> None:
            self.inbox.put(("stack", w, procmod.py_stack(pid)))

        threading.Thread(target=take_stack, name="py-spy", daemon=True).start()

    def _hung_stack(self, w: Watched, stack: str) -> None:
        """The stack for a pending ProcHung: send it, then the exit it held back, if any."""
        msg, w.hung_pending = w.hung_pending, None
        if msg is None or not any(w is x for x in self.watched):
            return  # a later attempt replaced it
        self.send(dataclasses.replace(msg, stack=stack))
        if not w.proc.alive:
            self._report_exit(w)

    def _flush_metrics(self, w: Watched, final: bool, parsed: list[P.Metric] | None = None) -> None:
        """Every metric of this flush (parsed from the log, or read from MSCON_METRICS) in one
        MetricBatch: one message per rank and flush, not one per step."""
        spec = w.proc.spec
        batch = parsed or []
        if w.has_metrics_file:
            for line in w.metrics.read_lines(final=final):
                obj = parse_metrics_line(line)
                if obj is None:
                    continue
                w.progress_ns = time.time_ns()
                batch.append(metric_from_record(self.node, spec.name, spec.rank, obj))
        if batch:
            self.send(P.MetricBatch(node=self.node, name=spec.name, rank=spec.rank, metrics=tuple(batch)))

    def _report_exit(self, w: Watched) -> None:
        p = w.proc
        if p.reported or p.returncode is None:
            return
        w.drained = self._flush(w, final=True)
        p.reported = True
        exitcode, sig, signum = procmod.describe_exit(p.returncode)
        recent = list(w.recent)
        self.send(
            P.ProcExited(
                node=self.node,
                name=p.spec.name,
                rank=p.spec.rank,
                pid=p.popen.pid,
                exitcode=exitcode,
                signal=sig,
                signum=signum,
                ts_ns=p.exit_ts_ns,
                stopped_by_agent=p.stop_sent,
                tail=tuple(recent[-20:]),
                traceback=extract_traceback(recent) if exitcode != 0 else None,
            )
        )

    def _telemetry(self) -> None:
        items = []
        for w in self.watched:
            if not w.proc.alive:
                continue
            cpu, rss = w.proc.sample()
            local = w.proc.spec.local_rank
            dev = self.devices.latest.get(local) if self.devices is not None and local >= 0 else None
            items.append(
                P.Telemetry(
                    node=self.node,
                    name=w.proc.spec.name,
                    rank=w.proc.spec.rank,
                    cpu_percent=cpu,
                    rss_bytes=rss,
                    ts=time.time(),
                    device_util=dev.util if dev else None,
                    device_mem_bytes=dev.used if dev else None,
                    device_mem_total=dev.total if dev else None,
                )
            )
        if items:  # the node's processes in one message a second, not one each
            self.send(P.TelemetryBatch(node=self.node, items=tuple(items)))

    # ------------------------------------------------------------ preflight

    def _run_checks(self, msg: P.RunChecks) -> None:
        """Checks run in one worker thread, in the order asked, so each ChecksDone answers the
        oldest open request and the agent keeps answering pings and stops meanwhile."""
        if self._checks is None:
            self._checks = queue.Queue()
            threading.Thread(target=self._checks_worker, name="checks", daemon=True).start()
        self._checks.put(msg)

    def _checks_worker(self) -> None:
        assert self._checks is not None
        while True:
            msg = self._checks.get()
            try:
                from . import checks  # imported on first use: a plain run never loads it

                found = checks.run_node_checks(msg.names, msg.params)
            except Exception as exc:  # noqa: BLE001 - an agent without checks still answers
                found = [{"name": "checks", "status": "warn", "value": "cannot run checks: %s" % exc}]
            try:
                for r in found:
                    self.send(
                        P.CheckResult(
                            node=self.node,
                            name=str(r.get("name", "?")),
                            status=str(r.get("status", "warn")),
                            value=str(r.get("value", "")),
                            remedy=str(r.get("remedy", "")),
                            detail=str(r.get("detail", "")),
                        )
                    )
                self.send(P.ChecksDone(node=self.node))
            except ConsoleGone:
                return

    def _mesh_listen(self, msg: P.MeshListen) -> None:
        if self._mesh is not None:
            self._mesh.close()
        try:
            self._mesh = MeshListener(msg.token + " " + self.node, msg.timeout_s, avoid=(msg.avoid_port,))
        except OSError as exc:
            self._mesh = None
            self.send(P.MeshListening(node=self.node, error="cannot listen: %s" % (exc.strerror or exc)))
            return
        self.send(P.MeshListening(node=self.node, port=self._mesh.port))

    def _mesh_probe(self, msg: P.MeshProbe) -> None:
        out: list = [None] * len(msg.peers)

        def one(i: int, peer: dict) -> None:
            out[i] = probe_peer(peer, msg.token, msg.timeout_s)

        peers = [dict(p) for p in msg.peers]
        threads = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in enumerate(peers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(msg.timeout_s + 2)
        results = tuple(r if r is not None else {"ok": False, "error": "no answer"} for r in out)
        try:
            self.send(P.MeshResult(node=self.node, results=results))
        except ConsoleGone:
            pass


def _ssh_server_addr() -> str | None:
    """The address the console reached this node on (SSH_CONNECTION: client ip, port, server ip, port)."""
    parts = os.environ.get("SSH_CONNECTION", "").split()
    return parts[2] if len(parts) == 4 else None


def _resolve(node: str, host: str) -> P.Resolved:
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return P.Resolved(node=node, host=host, error=str(exc))
    addrs = [str(info[4][0]) for info in infos]
    v4 = [a for a in addrs if ":" not in a]
    if not addrs:
        return P.Resolved(node=node, host=host, error="no address")
    return P.Resolved(node=node, host=host, address=(v4 or addrs)[0])


class UnsafeArchive(Exception):
    """The workdir archive is broken, or holds a member that would land outside the workdir."""


def _unpack(archive: str, dest: str) -> None:
    import tarfile

    os.makedirs(dest, exist_ok=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
                return
            # Python < 3.12 without the backport: refuse paths that escape dest
            root = os.path.realpath(dest)
            for member in tar.getmembers():
                target = os.path.realpath(os.path.join(dest, member.name))
                if (
                    not (target == root or target.startswith(root + os.sep))
                    or member.issym()
                    or member.islnk()
                ):
                    raise UnsafeArchive("unsafe member %r" % member.name)
            tar.extractall(dest)
    except tarfile.TarError as exc:
        raise UnsafeArchive(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    """By hand and in the agent's own tests: ``python -m <agent package> --node NAME [...]``."""
    import argparse  # only here: the console's boot calls serve() directly (argparse costs ~10 ms)

    parser = argparse.ArgumentParser(prog="mscon-agent", description="mscon node agent (JSON lines on stdio)")
    parser.add_argument("--node", required=True, help="this node's name in the inventory")
    parser.add_argument(
        "--attach", metavar="RUN_ID", help="relay to the detached run's agent (or read its files)"
    )
    parser.add_argument("--ls", action="store_true", help="list this node's runs as JSON lines")
    parser.add_argument("--cache", help="the cache folder runs are kept in (default ~/%s)" % CACHE_DIR)
    args = parser.parse_args(argv)
    return serve(args.node, attach=args.attach, ls=args.ls, cache=args.cache)


def serve(node: str, attach: str | None = None, ls: bool = False, cache: str | None = None) -> int:
    """Be this node's agent; or relay to a detached run's agent (``attach``); or list runs (``ls``)."""
    if ls:
        from .relay import ls_main

        return ls_main(node, cache)
    if attach:
        from .relay import relay_main

        return relay_main(node, attach, cache)
    return Agent(node).run()
