"""The node agent: takes commands as JSON lines on stdin, reports as JSON lines on stdout.

Policy: the console owns restarts and cross-node decisions; the agent owns its node's processes.
When a rank fails, the agent stops its node-local siblings at once (the console stops the other
nodes). When stdin closes (the console or its SSH channel is gone), the agent stops everything
and exits, so a crashed console leaves nothing behind, unless the console detached the run first
(``Detach``): then the agent becomes a daemon on a Unix socket and node 0's agent takes over the
run's policy (``detached/``: ``daemon.py`` the socket, ``run.py`` node 0's policy host).

Every lifecycle message is also kept in the run folder's journal (``journal.py``), so a console
that attaches later learns the whole run. This module is the loop and the commands; the node's
processes are ``ranks.py``'s, their logs and metrics ``streaming.py``'s, checks and probes
``services.py``'s (mixins of ``Agent``).
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING

from . import exit_codes, layout, node_rules
from . import procs as procmod
from . import protocol as P
from .checks.mesh import MeshListener
from .detached.relay import hello
from .journal import Journal, RunStatus, write_state
from .layout import CACHE_DIR
from .outbox import ConsoleGone, Outbox
from .policy import DEFAULT_GRACE_S, HangRule
from .ranks import Ranks
from .services import Services, resolve
from .spares import Spares
from .streaming import Streaming, Watched
from .streams import read_lines
from .tail import LineMetrics

if TYPE_CHECKING:
    from .detached.run import DetachedRun
    from .devices import DeviceSampler

# Imported where first used, not here: detaching (detached, coord, daemon), device sampling, the
# workdir archive (tarfile) and argparse cost tens of milliseconds at every agent start, and an
# agent that only runs checks, lists runs or relays an attach needs none of them.

_FINAL_WRITE_S = 30.0  # at exit, how long the last messages may take to reach a slow console


class Agent(Ranks, Streaming, Services):
    """One node's agent: its loop, its commands, its state; ranks, streaming and services are mixins."""

    def __init__(self, node: str, out=None) -> None:  # noqa: ANN001
        self.node = node
        self.outbox = Outbox(out or sys.stdout)  # never blocks: a slow console must not stall the loop
        self.inbox: queue.Queue = queue.Queue()
        self.watched: list[Watched] = []
        self.hang = HangRule()
        self.start_cmd: P.Start | None = None
        self.last_heard = time.monotonic()
        self.line_metrics = LineMetrics()
        self.devices: DeviceSampler | None = None  # started with the first Start (it knows the target)
        self.all_exited_sent = False
        self.failed = False
        self.stopping: procmod.GroupStop | None = None  # a stop under way, advanced by tick()
        self.spares = Spares()  # the next attempt's processes, started ahead (Start.spares)
        self._last_flush = 0.0
        # The console's Subscribe (None: none came, so every line and metric streams as before).
        self.subscription: P.Subscribe | None = None
        self._last_summary = 0.0
        self._summary_exits = 0  # processes reported exited at the last NodeSummary
        self._summary_counts: tuple = ()  # the last NodeSummary's counts (unchanged: none is sent)
        self._last_telemetry_sent = 0.0  # subscribed: telemetry goes once a summary tick
        self._last_telemetry = 0.0
        self._last_state_check = 0.0
        self._last_standby_check = 0.0
        self._checks: queue.Queue | None = None  # preflight requests, run one at a time by a thread
        self._mesh: MeshListener | None = None
        self.journal: Journal | None = None
        self.run_dir = ""
        self.detached: DetachedRun | None = None
        self.to_console = True  # False once a detached agent's console left: output goes to clients
        self.exit_now = False
        self._state_extra: dict = {}
        self._noted: set = set()

    # ------------------------------------------------------------ I/O

    def send(self, msg: P.Message, to_console: bool = True) -> None:
        """Journal, tell a detached run, and queue for the console (unless ``to_console`` is False:
        a line of a rank the console did not subscribe to, a metric its summary carries)."""
        if self.journal is not None and msg.journaled:
            self.journal.add(self.start_cmd.attempt if self.start_cmd else 0, msg.to_dict())
        if self.detached is not None:
            line = P.encode(msg)
            self.detached.observe(msg)  # the coordinator's policy, a follower's report
            self.detached.broadcast(line)  # consoles attached on the socket
        if not self.to_console or not to_console:
            return  # not even encoded: most lines of a large run go nowhere but their files
        line = P.encode(msg)
        if not self.outbox.put(line, msg.streamed, msg.alarm):
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
                        self.stop_and_wait("console closed the connection", self.grace())
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
                        self.grace(),
                        report=False,
                    )
                    self._final_state()
                    return 0
                try:
                    self.tick()
                    self._summary_tick()
                except OSError as exc:  # out of descriptors reading a log, say: the ranks go on
                    self._note_once("tick: %s" % exc)
                if self.detached is not None:
                    self._guarded(self.detached.tick)
                if self.exit_now:
                    if self.detached is not None:
                        self.detached.close()
                    return 0
        except ConsoleGone:
            self.stop_and_wait("console output closed", self.grace(), report=False)
            return 0
        except KeyboardInterrupt:
            self.stop_and_wait("agent interrupted", self.grace(), report=False)
            return exit_codes.INTERRUPTED

    def _note_once(self, what: str) -> None:
        """One stderr line (agent.err once detached) per kind of trouble, not one per tick."""
        if what not in self._noted:
            self._noted.add(what)
            print("mscon agent: %s" % what, file=sys.stderr, flush=True)

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
        detached = self.detached is not None
        return node_rules.console_silent(self._watchdog(), self.last_heard, time.monotonic(), detached)

    def grace(self) -> float:
        """How long a stopped process gets between TERM and KILL (the Start says; else the default)."""
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
        elif isinstance(msg, P.Subscribe):
            self.subscribe(msg)
        elif isinstance(msg, P.Shutdown):
            self.stop_and_wait("shutdown", self.grace())
            self.keep_standby(msg.keep_warm_s)
            return False
        elif isinstance(msg, P.Adopt):
            self.adopt(msg)
        elif isinstance(msg, P.Inspect):
            self.inspect(msg)
        elif isinstance(msg, P.Resolve):
            self.send(resolve(self.node, msg.host))
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
            from .detached.run import DetachedRun

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
        """The node's own verdict as the agent leaves (a detached coordinator records the run's);
        the trainer's state copies in node memory go with the run."""
        if self.run_dir:
            for folder in layout.own_shm_snapshot_folders(self.run_dir):
                shutil.rmtree(folder, ignore_errors=True)
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

    # ------------------------------------------------------------ supervision

    # ------------------------------------------------------------ preflight


def _ssh_server_addr() -> str | None:
    """The address the console reached this node on (SSH_CONNECTION: client ip, port, server ip, port)."""
    parts = os.environ.get("SSH_CONNECTION", "").split()
    return parts[2] if len(parts) == 4 else None


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


def serve(
    node: str,
    attach: str | None = None,
    ls: bool = False,
    cache: str | None = None,
    prune: dict | None = None,
) -> int:
    """Be this node's agent; or relay to a detached run's agent (``attach``); or list runs (``ls``);
    or remove old runs (``prune``: keep, older_than_days, dry_run)."""
    if prune is not None:
        from .retention import KEEP_RUNS, prune_main

        older = prune.get("older_than_days")
        return prune_main(
            node,
            cache,
            int(prune.get("keep", KEEP_RUNS)),
            float(older) if older is not None else None,
            bool(prune.get("dry_run")),
        )
    if ls:
        from .detached.relay import ls_main

        return ls_main(node, cache)
    if attach:
        from .detached.relay import relay_main

        return relay_main(node, attach, cache)
    return Agent(node).run()
