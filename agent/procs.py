"""Launching, watching and stopping the processes of one node (ranks and the scheduler).

Each process runs in its own session (so its whole process group can be signalled) and writes
stdout+stderr to a file under the run directory; the agent tails that file. A dropped console
connection therefore never blocks or SIGPIPEs a rank, and the full log stays on the node.
"""

from __future__ import annotations

import os
import posixpath
import signal
import subprocess
import time
from typing import Sequence

from . import layout, rank_env
from .protocol import ProcSpec

_UNLOADED = object()
_psutil: object = _UNLOADED


def psutil_module():  # noqa: ANN201 - psutil may be absent
    """psutil, imported on first use, or None where it is not installed (it is optional on nodes:
    without it we lose telemetry and the descendant sweep). An agent that starts no rank (checks,
    ls, attach) never pays its import, about 15 ms of every agent start."""
    global _psutil
    if _psutil is _UNLOADED:
        try:
            import psutil
        except ImportError:  # pragma: no cover - depends on the node
            psutil = None  # type: ignore[assignment]
        _psutil = psutil
    return _psutil


class Proc:
    """One launched process and what the agent knows about it."""

    def __init__(self, spec: ProcSpec, popen: subprocess.Popen, log_path: str, metrics_path: str) -> None:
        self.spec = spec
        self.popen = popen
        self.log_path = log_path
        self.metrics_path = metrics_path
        self.pgid = popen.pid  # start_new_session makes the child its own group leader
        self.returncode: int | None = None
        self.exit_ts_ns = 0
        self.stop_sent = False
        self.reported = False
        self.descendants: dict[int, float] = {}  # pid -> create_time, to never kill a reused pid
        self._ps = _ps_process(popen.pid)

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def poll(self) -> bool:
        """Reap the process if it has exited; True when it just did."""
        if self.returncode is not None:
            return False
        rc = self.popen.poll()
        if rc is None:
            return False
        self.returncode = rc
        self.exit_ts_ns = time.time_ns()
        return True

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def sample(self) -> tuple:
        """(cpu_percent, rss_bytes); remembers descendants so a stop can sweep them too."""
        if self._ps is None or not self.alive:
            return (None, None)
        try:
            cpu = self._ps.cpu_percent(None)
            rss = self._ps.memory_info().rss
            for child in self._ps.children(recursive=True):
                self.descendants[child.pid] = child.create_time()
            return (cpu, rss)
        except Exception:  # the process may vanish between calls
            return (None, None)


def _ps_process(pid: int):  # noqa: ANN202 - psutil may be absent
    psutil = psutil_module()
    if psutil is None:
        return None
    try:
        p = psutil.Process(pid)
        p.cpu_percent(None)  # prime the counter
        return p
    except Exception:
        return None


def _load_prctl():  # noqa: ANN202
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def new_session_dying_with_agent() -> None:
    """Runs in the child between fork and exec: own session, and KILL if the agent dies.

    The death signal covers an agent that is itself SIGKILLed (no chance to stop its ranks).
    """
    os.setsid()
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


# The rank-side library shipped beside the agent (console/transport/bundle.py); absent where the
# agent runs from an installed mscon, whose mscon_resume is on the ranks' path already.
_RANK_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), layout.RANK_LIBRARY_DIR)


def run_key(run_dir: str) -> str:
    """The run's snapshot key on this node (hex): made once, 0600, published with a link so that
    every process of the run reads the same whole key; it never leaves the node."""
    path = layout.resume_key_file(run_dir)
    if not os.path.exists(path):
        tmp = "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(4).hex())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.remove(tmp)
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def library_env(env: dict, run_dir: str) -> None:
    """What mscon_resume reads in every rank: the run's state folder (its snapshots' node-memory
    twin is named after it) and key, and the library itself on PYTHONPATH (first: the copy that
    matches this agent)."""
    env[rank_env.STATE_DIR] = layout.checkpoint_folder(run_dir)
    env[rank_env.COMPILE_CACHE] = layout.compile_cache_folder(run_dir)  # compiled graphs, for the restarts
    try:
        env[rank_env.SNAPSHOT_KEY] = run_key(run_dir)
    except OSError:
        pass  # the library then keys its own private folder
    if os.path.isdir(_RANK_LIBRARY):
        path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = _RANK_LIBRARY + (os.pathsep + path if path else "")


def process_env(spec: ProcSpec, log_dir: str, base_env: dict) -> dict:
    """The environment a process of ``spec`` runs with in the attempt whose folder is ``log_dir``
    (a cold launch and a spare becoming the rank get the same)."""
    env = dict(base_env)
    env.update(spec.env)
    env[rank_env.METRICS] = layout.metrics_file(log_dir, spec.name)
    library_env(env, posixpath.dirname(log_dir))
    prepend = env.pop(rank_env.PATH_PREPEND, "")
    if prepend:
        env["PATH"] = prepend + os.pathsep + env.get("PATH", os.defpath)
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the log file as they are printed
    return env


def attempt_env(attempt: int) -> dict:
    """What every process of an attempt inherits before its own settings: the agent's environment."""
    env = dict(os.environ)
    env[rank_env.ATTEMPT] = str(attempt)  # as torchrun's TORCHELASTIC_RESTART_COUNT
    return env


def launch(spec: ProcSpec, cwd: str, log_dir: str, base_env: dict[str, str]) -> Proc:
    log_path = layout.log_file(log_dir, spec.name)
    metrics_path = layout.metrics_file(log_dir, spec.name)
    popen = spawn(spec.argv, cwd, process_env(spec, log_dir, base_env), log_path)
    return Proc(spec, popen, log_path, metrics_path)


def spawn(
    argv: Sequence[str], cwd: str, env: dict, log_path: str, stdin: int = subprocess.DEVNULL
) -> subprocess.Popen:
    """How the agent starts every process of an attempt, rank or spare: in its own session, killed
    if the agent dies, stdout and stderr appended to ``log_path`` (0600; a restarted attempt never
    truncates what an earlier one wrote). OSError when it cannot start."""
    with layout.private_open(log_path, "ab", buffering=0) as log:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            close_fds=True,
            preexec_fn=new_session_dying_with_agent,
        )


_KILL_WAIT_S = 5.0  # after the KILL, how long a stop waits for processes that do not go (D state)


class GroupStop:
    """One stop of a node's processes, advanced a step at a time so the agent's loop keeps serving
    (pings, log lines, other nodes' orders) while ranks take their grace: TERM every live process
    group at once, KILL what is left at the grace deadline, stop waiting ``_KILL_WAIT_S`` later.
    Processes that forked away from their group (seen via psutil while they ran) are killed at the
    end too, so no descendant keeps holding a device after a stop.

    The caller reaps (``Proc.poll``) before each ``step``: every exit is seen, and reported, there.
    """

    def __init__(self) -> None:
        self.procs: list[Proc] = []  # every process of the stop, to sweep their groups at the end
        self.kill_at = float("inf")
        self._killed = False

    def add(self, procs: list[Proc], grace_s: float, now: float) -> None:
        """TERM the live processes not yet stopping; a shorter grace brings the KILL forward."""
        for p in procs:
            if any(p is q for q in self.procs):
                continue
            self.procs.append(p)
            if p.alive:
                p.stop_sent = True
                p.signal_group(signal.SIGTERM)
                p.signal_group(signal.SIGCONT)  # a stopped (SIGSTOP) process acts on TERM only once continued
                self._killed = False
        self.kill_at = min(self.kill_at, now + max(grace_s, 0.0))

    def step(self, now: float) -> bool:
        """KILL when the grace is over; True once every process has gone (or been given up on)
        and the leftovers are swept: the stop is over."""
        live = [p for p in self.procs if p.alive]
        if live and now >= self.kill_at and not self._killed:
            self._killed = True
            for p in live:
                p.signal_group(signal.SIGKILL)
        if live and now < self.kill_at + _KILL_WAIT_S:
            return False
        sweep_descendants(self.procs)
        return True

    def wait(self, on_reap=None) -> None:  # noqa: ANN001
        """Block until the stop is over, reaping as it goes: only for a caller with nothing else
        to serve (an agent that is leaving)."""
        while True:
            for p in self.procs:
                if p.poll() and on_reap is not None:
                    on_reap(p)
            if self.step(time.monotonic()):
                return
            time.sleep(0.02)


def sweep_descendants(procs: list[Proc]) -> None:
    """KILL leftovers: members of each group, and descendants that escaped it."""
    psutil = psutil_module()
    for p in procs:
        p.signal_group(signal.SIGKILL)
        for pid, created in p.descendants.items():
            try:
                if psutil is not None and psutil.Process(pid).create_time() == created:
                    os.kill(pid, signal.SIGKILL)
            except Exception:  # gone already, or not ours to touch
                pass


def describe_exit(returncode: int) -> tuple:
    """(exitcode, signal name, signal number) from a Popen return code."""
    if returncode < 0:
        signum = -returncode
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "SIG%d" % signum
        return (None, name, signum)
    return (returncode, None, None)


_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk sleep",
    "T": "stopped",
    "t": "tracing stop",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}


def proc_state(pid: int) -> str:
    """The /proc state letter of a process ("" where there is no /proc or it is gone)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    # The command name may hold spaces and parentheses: the state follows the last ")".
    rest = data[data.rfind(b")") + 2 :]
    return rest[:1].decode("ascii", "replace")


def describe_state(letter: str) -> str:
    return "%s (%s)" % (letter, _STATES.get(letter, "unknown")) if letter else "unknown"


def wchan(pid: int) -> str:
    try:
        with open("/proc/%d/wchan" % pid) as f:
            text = f.read().strip()
    except OSError:
        return ""
    return "" if text in ("0", "") else text


def py_stack(pid: int, timeout: float = 10.0) -> str:
    """The Python stack of every thread (py-spy dump) where py-spy is installed, else ""."""
    import shutil
    import sys

    exe = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if exe is None:
        return ""
    try:
        done = subprocess.run(
            [exe, "dump", "--nonblocking", "--pid", str(pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "py-spy dump failed: %s" % exc
    return done.stdout.decode("utf-8", "replace").strip()
