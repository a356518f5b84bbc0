"""The agent's side of a kept standby (``keeper.py``): leave one as a run ends, and adopt it.

- ``keep``: as a run that ended by itself leaves (``Shutdown.keep_warm_s``), start the node's
  keeper with the next run's first-attempt processes (``on_standby(spec, 0)``: they join on that
  attempt's standby port), after ending any earlier keeper of the node.
- ``connect``/``Keeper``: a client of the keeper's socket; ``fit`` says whether its spares can be
  this run's processes; ``KeptPopen`` stands for a spare the keeper reaps (exit statuses come over
  the socket), so the rank it becomes is watched like any other.
- ``drop``: end the node's keeper (a run that does not adopt it needs its CPU, memory, devices).

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

from . import layout, rank_env
from . import procs as procmod
from .keeper import PIDFILE, SOCKET  # the keeper's own names (it runs as a file, importing only streams.py)
from .protocol import ProcSpec, on_standby
from .streams import LineSplitter

KEEPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keeper.py")
BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spare_boot.py")
_ERRORS = "keeper.err"  # the keeper's stderr, in its folder
_REPLY_S = 5.0
_GONE_S = 10.0
# What differs between two runs of one job without changing what MindSpore saw at import and
# join: the attempt's metrics file, the run's snapshot folder and key, the SSH session's own variables.
_RUN_KEYS = rank_env.PER_RUN | frozenset(("OLDPWD", "_", "XDG_SESSION_ID"))
_open: list = []  # this agent's connections (a keeper serves one at a time)


def _run_specific(key: str) -> bool:
    return key in _RUN_KEYS or key.startswith("SSH_")


def same_job_env(a: dict, b: dict) -> str | None:
    """None when ``a`` and ``b`` differ only in run-specific keys, else the first key that differs."""
    for key in sorted(set(a) | set(b)):
        if not _run_specific(key) and a.get(key) != b.get(key):
            return key
    return None


def eligible(spec: ProcSpec) -> bool:
    """``python SCRIPT.py ARGS``: what a spare can become (not ``-m``, ``-c`` or a binary)."""
    argv = spec.argv
    return len(argv) >= 2 and argv[1].endswith(".py") and not argv[1].startswith("-")


def first_attempt_env(spec: ProcSpec, run_dir: str) -> dict:
    """The environment ``spec`` (already on the standby port) gets as attempt 0 of a run in ``run_dir``."""
    return procmod.process_env(spec, layout.attempt_folder(run_dir, 0), procmod.attempt_env(0))


# ---------------------------------------------------------------- the client


class Keeper:
    """A connection to the node's keeper (one adopter at a time)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.split = LineSplitter()
        self.lines: list = []  # complete lines from the keeper, not read yet
        self.exits: dict = {}  # name -> Popen-style return code, as the keeper relays them
        self.gone = False
        self.busy = False  # it serves another agent (an adopted standby: its run's ranks)
        _open.append(self)

    def _send(self, obj: dict) -> None:
        self.sock.sendall((json.dumps(obj) + "\n").encode("utf-8"))

    def _read(self, timeout: float | None) -> dict | None:
        """The next reply (exit reports are kept aside), or None when none came in ``timeout``
        (0: only what has arrived)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self.lines:
                line = self.lines.pop(0)
                try:
                    msg = json.loads(line.decode("utf-8"))
                except ValueError:
                    continue
                if "exit" in msg:
                    self.exits[msg["exit"]] = int(msg["returncode"])
                elif msg.get("busy"):
                    self.busy = True
                    return None
                else:
                    return msg
            if self.gone:
                return None
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                readable, _, _ = select.select([self.sock], [], [], left)
            except (OSError, ValueError):
                readable = [self.sock]
            if not readable:
                return None
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.gone = True  # its spares died with it (parent-death signal)
                continue
            self.lines += self.split.feed(data)

    def ask(self, obj: dict) -> dict | None:
        try:
            self._send(obj)
        except OSError:
            pass  # it closed on us: what it said first (busy) is still to be read
        return self._read(_REPLY_S)

    def pump(self) -> None:
        """Take in the exit reports that have come (never blocks)."""
        if not self.gone:
            self._read(0.0)

    def returncode(self, name: str) -> int | None:
        self.pump()
        if name in self.exits:
            return self.exits[name]
        return -signal.SIGKILL if self.gone else None

    def drop(self) -> bool:
        """End the keeper and its spares, and wait until it is gone; False when it serves another
        agent (it is that run's, not ours to end)."""
        try:
            self._send({"op": "drop"})
        except OSError:
            pass
        deadline = time.monotonic() + _GONE_S
        while not self.gone and not self.busy and time.monotonic() < deadline:
            self._read(deadline - time.monotonic())
        self.close()
        return not self.busy

    def close(self) -> None:
        self.sock.close()
        self.gone = True
        if self in _open:
            _open.remove(self)


class KeptPopen:
    """A spare the keeper holds, as the agent's watching code uses a Popen."""

    def __init__(self, keeper: Keeper, name: str, pid: int) -> None:
        self.keeper = keeper
        self.name = name
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.keeper.returncode(self.name)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
            self.keeper._read(0.05)
        return self.returncode  # type: ignore[return-value]


def connect(folder: str) -> Keeper | None:
    """The node's keeper, or None where none serves."""
    path = os.path.join(folder, SOCKET)
    if not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    here = os.getcwd()
    try:
        os.chdir(folder)  # a relative name: absolute socket paths may pass the 107-byte limit
        sock.settimeout(_REPLY_S)
        sock.connect(SOCKET)
        sock.settimeout(None)  # reads wait in select()
    except OSError:
        sock.close()
        return None
    finally:
        os.chdir(here)
    return Keeper(sock)


def fit(state: dict, procs: tuple, run_dir: str) -> str | None:
    """Why the kept spares (``state``) cannot be ``procs`` (on the standby port of attempt 0), or
    None: they can, once they have all joined (a run that comes while they join waits for them)."""
    kept = state.get("procs") or {}
    if state.get("lost"):
        return state["lost"]
    if sorted(kept) != sorted(s.name for s in procs):
        return "it holds %s, this run has %s" % (
            ", ".join(sorted(kept)),
            ", ".join(sorted(s.name for s in procs)),
        )
    for spec in procs:
        held = kept[spec.name]
        if list(held["argv"][:2]) != list(spec.argv[:2]):
            return "%s runs %s, this run %s" % (
                spec.name,
                " ".join(held["argv"][:2]),
                " ".join(spec.argv[:2]),
            )
        key = same_job_env(held["env"], first_attempt_env(spec, run_dir))
        if key is not None:
            return "%s's environment differs in %s" % (spec.name, key)
    return None


def drop(folder: str) -> None:
    """End the node's keeper, if one serves (or is still on its way out) and no other run holds it."""
    keeper = connect(folder)
    if keeper is None or keeper.drop():
        _wait_gone(folder)


def _keeper_pid(folder: str) -> int | None:
    """The pid its keeper.pid names, if that process is still this folder's keeper: a keeper that
    was killed leaves the file behind, and its pid may be another process's by now."""
    try:
        with open(os.path.join(folder, PIDFILE)) as f:
            pid = int(f.read().strip())
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
        here = os.readlink("/proc/%d/cwd" % pid)
    except (OSError, ValueError):
        return None
    if not any(a.endswith(b"/keeper.py") for a in argv[1:3]) or here != os.path.realpath(folder):
        return None
    return pid


def _wait_gone(folder: str) -> None:
    pid = _keeper_pid(folder)
    if pid is None:
        return
    deadline = time.monotonic() + _GONE_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        if procmod.proc_state(pid) in ("Z", ""):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)  # its spares follow it (parent-death signal)
    except OSError:
        pass


# ---------------------------------------------------------------- leaving one


def keep(procs: tuple, run_dir: str, node: str, ttl_s: float) -> str | None:
    """Start the node's keeper for the next run of this job; an error line, or None."""
    specs = tuple(on_standby(s, 0) for s in procs)
    if not specs or not all(eligible(s) for s in specs):
        return "no standby kept: a process is not run as `python SCRIPT.py`"
    folder = layout.kept_folder(run_dir, node)
    for held in list(_open):  # the standby this run adopted: its ranks are gone, so is its keeper
        held.close()
    _wait_gone(folder)
    other = connect(folder)
    if other is not None and not other.drop():
        return "no standby kept: another run holds this node's"
    _wait_gone(folder)
    try:
        layout.private_dirs(folder)  # warm/ and warm/<node>/
        for entry in os.listdir(folder):
            if entry.endswith((".log", ".joined")):
                os.unlink(os.path.join(folder, entry))
    except OSError as exc:
        return "no standby kept: %s" % exc
    cwd = os.getcwd()
    order = {"folder": folder, "ttl_s": ttl_s, "kept_by": run_dir, "procs": []}
    for spec in specs:
        marker = os.path.join(folder, spec.name + ".joined")
        order["procs"].append(
            {
                "name": spec.name,
                "argv": list(spec.argv),
                "boot_argv": [spec.argv[0], BOOT, "--join", marker],
                "env": first_attempt_env(spec, run_dir),
                "cwd": cwd,
                "log": os.path.join(folder, spec.name + ".log"),
                "marker": marker,
                "scheduler": spec.is_scheduler,
            }
        )
    try:
        with layout.private_open(os.path.join(folder, _ERRORS), "ab", buffering=0) as err:
            popen = subprocess.Popen(
                [sys.executable, KEEPER],
                cwd=folder,
                stdin=subprocess.PIPE,
                stdout=err,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,  # outlives this agent: that is its point
            )
        assert popen.stdin is not None
        popen.stdin.write(json.dumps(order).encode("utf-8"))
        popen.stdin.close()
    except OSError as exc:
        return "no standby kept: %s" % exc
    # Serving (its spares started) before this agent leaves: a run right after this one finds it
    # and waits for its spares to join, rather than not finding it and launching cold.
    deadline = time.monotonic() + _REPLY_S
    while not os.path.exists(os.path.join(folder, PIDFILE)):
        if popen.poll() is not None or time.monotonic() > deadline:
            return "no standby kept: its keeper did not start (%s)" % os.path.join(folder, _ERRORS)
        time.sleep(0.01)
    return None
