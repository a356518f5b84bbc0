"""The node's processes: starting an attempt's ranks, stopping them (TERM, then KILL at the grace
deadline, never blocking the loop), reaping and reporting each exit, and seeing a rank that hangs
(state T, unasked; silent, when the policy's host asks: ``inspect``). A mixin of ``main.Agent``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

from . import compile_cache, kept, layout, node_rules
from . import procs as procmod
from . import protocol as P
from .journal import Journal
from .layout import attempt_folder
from .policy import HangRule
from .streaming import Watched
from .tail import LineMetrics, extract_traceback


class UnsafeArchive(Exception):
    pass


def _prune_older_runs(cmd: P.Start, node: str) -> None:
    """The node's runs beyond the retention count go as this one starts, off the loop's thread:
    deleting a large run folder must not hold up the ranks."""
    from .retention import KEEP_RUNS, prune_at_start

    keep = KEEP_RUNS if cmd.keep_runs is None else cmd.keep_runs
    threading.Thread(target=prune_at_start, args=(cmd.run_dir, node, keep), name="prune", daemon=True).start()


class Ranks:
    """Starting, stopping, reaping and reporting the node's processes (``main.Agent``'s state)."""

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
        self.hang = HangRule()  # each rank's pace this attempt (told to a detached coordinator)
        self.all_exited_sent = False
        self.failed = False
        log_dir = attempt_folder(cmd.run_dir, cmd.attempt)
        try:
            if os.path.isdir(log_dir) and os.listdir(log_dir):
                # Never mix two runs' logs: a reused run id would make old lines look new.
                raise OSError(
                    "%s already holds logs of an earlier run with this run id: give another "
                    "--run-id, or remove that run's folder (mscon prune, or rm -r) to reuse the id" % log_dir
                )
            layout.private_dirs(log_dir)  # 0700, each level made: runs/<id>/<node>/attempt_<N>/
            if self.journal is None:
                os.chmod(cmd.run_dir, 0o700)  # logs, journal and (detached) the socket: the user's only
                # Made here, 0700, so that whatever the job writes there is the user's only.
                layout.private_dirs(layout.checkpoint_folder(cmd.run_dir))
                compile_cache.prepare(cmd.run_dir)  # 0700 before a rank writes its graphs there
                self.run_dir = cmd.run_dir
                self.journal = Journal(cmd.run_dir)
                self._state_extra["started"] = time.time()
                _prune_older_runs(cmd, self.node)
            if cmd.workdir_archive:
                _unpack(cmd.workdir_archive, cmd.cwd)
            if not os.path.isdir(cmd.cwd):
                raise OSError("working directory %s does not exist" % cmd.cwd)
        except (OSError, UnsafeArchive) as exc:
            self.send(P.AgentError(node=self.node, message="cannot prepare run: %s" % exc))
            self.send(P.AllExited(node=self.node, ts_ns=time.time_ns()))
            self.all_exited_sent = True
            return
        self._bound_graphs(cmd.run_dir)
        base_env = procmod.attempt_env(cmd.attempt)
        procs = cmd.procs
        if cmd.warm:  # every node's standby is ready: its processes become the attempt, on its port
            procs = tuple(P.on_standby(s, cmd.attempt) for s in procs)
            gone = self.spares.missing(procs, cmd.run_dir, cmd.attempt, cmd.cwd)
            if gone is not None:  # a failed start: the policy stops the others, the next is cold
                self.spares.discard()
                self.send(P.AgentError(node=self.node, message="cannot start warm: %s" % gone))
                self.send(P.AllExited(node=self.node, ts_ns=time.time_ns()))
                self.all_exited_sent = True
                return
        elif self.spares.joined:
            self.spares.discard()  # a standby of no use: its CPU and memory are the ranks'
        if cmd.attempt == 0 and not cmd.warm and cmd.drop_kept:
            kept.drop(layout.kept_folder(cmd.run_dir, self.node))  # a standby kept for another job
        # Scheduler first: workers retry their connection to it, but it should be up early.
        for spec in sorted(procs, key=lambda s: not s.is_scheduler):
            try:
                proc = self.spares.take(spec, cmd.run_dir, cmd.attempt, cmd.cwd)
                if proc is None:
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
        self.spares.discard()  # those this attempt did not take
        self._save_state()
        self._prepare_spares()

    def _bound_graphs(self, run_dir: str) -> None:
        """The run's compiled graphs held to their bound before the attempt's ranks load them."""
        try:
            gone = compile_cache.bound(run_dir)
        except OSError as exc:
            self._note_once("compile cache: %s" % exc)
            return
        if gone:
            size = compile_cache.describe(sum(e.bytes for e in gone))
            self._note_once(
                "compile cache: %d graph folder(s) (%s) removed to stay within %s"
                % (len(gone), size, compile_cache.describe(compile_cache.MAX_BYTES))
            )

    def adopt(self, msg: P.Adopt) -> None:
        """Take the standby a run of this job kept on the node, if it fits attempt 0 (the policy
        starts it warm only when every node's did): answered with a StandbyState."""
        try:
            folder = layout.kept_folder(msg.run_dir, self.node)
        except ValueError as exc:
            self.send(P.StandbyState(node=self.node, attempt=0, state=P.StandbyPhase.LOST, why=str(exc)))
            return
        specs = tuple(P.on_standby(s, 0) for s in msg.procs)
        why = self.spares.adopt(folder, msg.run_dir, msg.cwd, specs)
        if why is not None:
            self.send(P.StandbyState(node=self.node, attempt=0, state=P.StandbyPhase.LOST, why=why))
        else:
            self._standby_state()  # ready now, or joining: ready once its spares have joined

    def keep_standby(self, ttl_s: float) -> None:
        """As the agent leaves a run that ended by itself: a joined standby for the next run."""
        cmd = self.start_cmd
        if cmd is None or ttl_s <= 0:
            return
        if any(w.proc.alive for w in self.watched):  # a stop not over (an orphaned detached run)
            self._note_once("no standby kept: the run's processes are still stopping")
            return
        error = kept.keep(cmd.procs, cmd.run_dir, self.node, ttl_s)
        if error is not None:
            self._note_once(error)

    def _prepare_spares(self) -> None:
        """Start the next attempt's processes ahead: a restart then skips Python's start,
        MindSpore's import and (joined) the cluster join. A cold attempt starts them with its own
        processes: its start-up (import, join, data, compile: 10 s and more) covers theirs, so
        they are ready by its first step; started once its ranks had stepped, they imported while
        the ranks trained, starved of CPU, and a fault in the first 15-20 s of training restarted
        cold (issue 43). A warm attempt starts them once its workers have stepped: its start-up is
        the first step's compile, which their import would lengthen (4.8 s -> 7.4 s from the fault
        on 2 cores, bench/user_restart.py --max-restarts 2)."""
        cmd = self.start_cmd
        if cmd is None or not cmd.spares or self.spares.attempt > cmd.attempt or self.failed:
            return
        workers = [w for w in self.watched if not w.proc.spec.is_scheduler]
        if not workers or (cmd.warm and not all(w.first_step_said for w in workers)):
            return
        for error in self.spares.prepare(cmd.run_dir, cmd.attempt + 1, cmd.cwd, cmd.procs, cmd.join_standby):
            self._note_once(error)
        self._standby_state()  # joining: a restart due before they have joined may wait for them

    def _standby_state(self) -> None:
        """Say when this node's standby for the next attempt is ready, or is lost (the policy's
        warm-or-cold choice)."""
        said = self.spares.poll()
        if said is not None:
            state, why = said
            self.send(P.StandbyState(node=self.node, attempt=self.spares.attempt, state=state, why=why))
            if state is P.StandbyPhase.LOST:
                self._note_once(
                    "standby for attempt %d lost: %s; a restart would be cold" % (self.spares.attempt, why)
                )

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
        self.spares.discard()
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

    def tick(self) -> None:
        now = time.monotonic()
        exited = [w for w in self.watched if w.proc.poll()]
        if self.stopping is not None and self.stopping.step(now):  # after the reaping above
            self.stopping = None
        if now - self._last_standby_check >= node_rules.STATE_CHECK_S:  # also between attempts
            self._last_standby_check = now
            self._standby_state()
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
            if node_rules.stops_siblings(w.proc.returncode, w.proc.stop_sent, self.failed):
                self.failed = True  # root-cause candidate: its siblings stop now
                self.stop("%s failed" % w.proc.spec.name, self.grace())
        if now - self._last_telemetry >= 1.0:
            self._last_telemetry = now
            self._telemetry()
        if now - self._last_state_check >= node_rules.STATE_CHECK_S:
            self._last_state_check = now
            self._prepare_spares()
            self._check_stopped(now)
        if all(w.proc.reported and w.drained for w in self.watched):
            self.send(P.AllExited(node=self.node, ts_ns=time.time_ns()))
            self.all_exited_sent = True

    def _check_stopped(self, now: float) -> None:
        """A rank in state T makes no progress and never will on its own: report it unasked."""
        for w in self.watched:
            if not w.proc.alive or w.hung_reported or w.proc.stop_sent:
                continue
            state = procmod.proc_state(w.proc.popen.pid)
            w.stopped_since, hung = node_rules.stopped_state(state, w.stopped_since, now)
            if hung:
                self._report_hung(w, "stopped")

    def inspect(self, msg: P.Inspect) -> None:
        """The policy saw these ranks silent on its host's clock (a console's, or a detached
        coordinator's): a rank whose lines its host has not heard of yet (a console behind at
        scale, a progress report on its way) is not hung; only a rank silent here too is reported."""
        cutoff = time.time_ns() - int(msg.silent_s * 1e9)
        for w in self.watched:
            if w.proc.spec.name in msg.names and w.proc.alive and w.progress_ns <= cutoff:
                self._report_hung(w, msg.reason or "no progress")

    def progress_report(self) -> dict:
        """The live workers' progress as read here, for a detached coordinator's hang rule (the
        policy's): name -> [progress stamp, seconds since it, step pace] (``P.LinkProgress``)."""
        now_ns = time.time_ns()
        out = {}
        for w in self.watched:
            spec = w.proc.spec
            if w.proc.alive and not spec.is_scheduler:  # the scheduler is quiet by nature
                pace = self.hang.pace(spec.name)
                out[spec.name] = [w.progress_ns, (now_ns - w.progress_ns) / 1e9, pace and list(pace)]
        return out

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


def _unpack(archive: str, dest: str) -> None:
    import tarfile

    layout.private_dirs(dest)  # 0700: its files keep their modes inside
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
