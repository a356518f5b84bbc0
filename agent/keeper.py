"""The kept standby: a joined standby cluster that outlives its run, for the next run of the job.

A launch is MindSpore's own time (import, then seconds of fixed 3 s polls in its cluster join:
docs/recovery.md), and only a process that outlives the run can skip it. With
``restart.keep_warm_s`` the agent of a run that ended by itself starts this keeper as it leaves:
the keeper starts one spare per process of the node (``spare_boot.py --join``) with the next
run's first-attempt environment, on that attempt's standby port, and holds them for the TTL. The
next run's agent asks it (``state``); when every node's standby has joined and fits the new job,
the policy starts attempt 0 warm on it (``adopt``, then one ``order`` per process) and the keeper
relays each exit status (only a parent can reap, and the agent is not theirs).

The keeper is the spares' parent and their only holder: they die with it (parent-death signal),
it kills them when the TTL passes unclaimed, when a spare or its cluster is lost before adoption,
when asked (``drop``: a run that does not fit, or that keeps none), and when its adopter goes (a
crashed console's agent: no orphans hold devices). It serves one Unix socket in a 0700 folder and
takes connections only from its own user (SO_PEERCRED).

Run as a file (``python keeper.py``) with its order as JSON on stdin, never imported by the agent
(the agent's side is ``kept.py``); of the agent it imports only ``streams.py``, from its own
folder. Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

try:
    from .streams import LineSplitter
except ImportError:  # run as a file (its purpose): its own folder is sys.path[0]
    from streams import LineSplitter  # type: ignore[no-redef]

SOCKET = "keeper.sock"  # bound relative to its folder (absolute paths may pass the 107-byte limit)
PIDFILE = "keeper.pid"  # written once its spares are started, removed as it ends
_TICK_S = 0.1
LINE_MAX = 64 * 1024  # an adopter's request is a short line; a longer one drops that client
_SEND_S = 5.0  # a client that does not read its replies is dropped, not waited on
_BACKOFF_S = 0.1  # out of descriptors: accept again after this long, serving what is held meanwhile


def _private(path: str, flags: int) -> int:
    """``path`` opened for writing, 0600 whatever the umask (layout.private_fd: this file runs
    alone and imports nothing of the agent but streams.py)."""
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def _dying_with_keeper() -> None:
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


class Held:
    def __init__(self, spec: dict, popen: subprocess.Popen) -> None:
        self.spec = spec
        self.popen = popen
        self.returncode: int | None = None
        self.said = False  # its exit was sent to the adopter


class Keeper:
    def __init__(self, order: dict) -> None:
        self.order = order
        self.held: dict = {}
        self.started = time.monotonic()
        self.ttl_s = float(order["ttl_s"])
        self.adopted = False
        self.client: socket.socket | None = None
        self.split = LineSplitter()  # the adopter's requests, one JSON object a line
        self.why_lost = ""
        self.accept_after = 0.0  # accept() failed (out of descriptors): not before this
        self.accept_failing = False  # said so on stderr once, until an accept succeeds

    def spawn(self) -> None:
        for spec in self.order["procs"]:
            with os.fdopen(_private(spec["log"], os.O_WRONLY | os.O_APPEND), "ab", buffering=0) as out:
                popen = subprocess.Popen(
                    spec["boot_argv"],
                    cwd=spec["cwd"],
                    env=spec["env"],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    close_fds=True,
                    preexec_fn=_dying_with_keeper,
                )
            self.held[spec["name"]] = Held(spec, popen)

    # ------------------------------------------------------------ state

    def reap(self) -> None:
        for name, h in sorted(self.held.items()):
            if h.returncode is None:
                rc = h.popen.poll()
                if rc is not None:
                    h.returncode = rc
                    if not self.adopted and not self.why_lost:
                        how = "signal %d" % -rc if rc < 0 else "exit code %d" % rc
                        self.why_lost = "the kept spare for %s exited (%s)" % (name, how)

    def ready(self) -> bool:
        return not self.why_lost and all(
            h.returncode is None and (h.spec["scheduler"] or os.path.exists(h.spec["marker"]))
            for h in self.held.values()
        )

    def state(self) -> dict:
        """What an adopter decides on: whether the spares fit its run (argv, environment), whether
        they have all joined (``ready``; each worker's ``marker`` says so) or one is lost."""
        return {
            "kept_by": self.order["kept_by"],
            "ready": self.ready(),
            "lost": self.why_lost,
            "procs": {
                name: {
                    "pid": h.popen.pid,
                    "argv": h.spec["argv"],
                    "env": h.spec["env"],
                    "log": h.spec["log"],
                    "marker": h.spec["marker"],
                }
                for name, h in self.held.items()
                if h.returncode is None
            },
        }

    def kill_all(self) -> None:
        for h in self.held.values():
            if h.returncode is None:
                try:
                    os.killpg(h.popen.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for h in self.held.values():
            try:
                h.popen.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - D state
                pass

    # ------------------------------------------------------------ the adopter

    def send(self, obj: dict) -> None:
        if self.client is None:
            return
        try:
            self.client.sendall((json.dumps(obj) + "\n").encode("utf-8"))
        except OSError:
            self.drop_client()

    def drop_client(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
            self.split = LineSplitter()

    def command(self, msg: dict) -> bool:
        """One request of the adopter; False when the keeper should end."""
        op = msg.get("op")
        if op == "state":
            self.send(self.state())
        elif op == "adopt":
            self.adopted = True
            self.send({"adopted": True})
        elif op == "order" and self.adopted:
            h = self.held.get(msg.get("name"))
            ok = h is not None and h.returncode is None and h.popen.stdin is not None
            if ok:
                try:
                    if msg.get("path"):  # none: it serves as it is (a scheduler), and exits after
                        h.popen.stdin.write((str(msg["path"]) + "\n").encode("utf-8"))
                    h.popen.stdin.close()
                except (OSError, ValueError, KeyError):
                    ok = False
            self.send({"ordered": msg.get("name"), "ok": ok})
        elif op == "drop":
            return False
        return True

    def relay_exits(self) -> None:
        if not self.adopted or self.client is None:
            return
        for name, h in sorted(self.held.items()):
            if h.returncode is not None and not h.said:
                h.said = True
                self.send({"exit": name, "returncode": h.returncode})

    # ------------------------------------------------------------ the loop

    def serve(self, listener: socket.socket) -> None:
        while True:
            self.reap()
            self.relay_exits()
            now = time.monotonic()
            if not self.adopted:
                if self.why_lost or now - self.started > self.ttl_s:
                    return  # lost before adoption (all or nothing), or unclaimed
            elif self.client is None:
                return  # its adopter went: the ranks still running go too (no orphans)
            watch = [listener] if now >= self.accept_after else []
            watch += [self.client] if self.client is not None else []
            readable, _, _ = select.select(watch, [], [], _TICK_S)
            # The client first: a client that closed and then connected again is one adopter.
            if self.client is not None and self.client in readable:
                try:
                    data = self.client.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.drop_client()
                    continue
                for line in self.split.feed(data):
                    if self.client is None:
                        break  # dropped while answering: the rest of its lines go with it
                    try:
                        msg = json.loads(line.decode("utf-8"))
                    except ValueError:
                        continue
                    if not isinstance(msg, dict) or not self.command(msg):
                        return
                if len(self.split.rest()) > LINE_MAX:
                    self.drop_client()  # a line no adopter sends: that client goes, the keeper stays
            if listener in readable:
                self.accept(listener)

    def accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:
            # Out of descriptors (EMFILE, ENFILE) or another passing failure: the keeper and its
            # spares stay; the connection waits in the backlog until an accept works again.
            if not self.accept_failing:
                sys.stderr.write("keeper: cannot accept (%s), trying again\n" % (exc.strerror or exc))
                sys.stderr.flush()
            self.accept_failing = True
            self.accept_after = time.monotonic() + _BACKOFF_S
            return
        self.accept_failing = False
        conn.settimeout(_SEND_S)  # replies are short; a client that never reads is dropped
        if not _same_user(conn):
            conn.close()
            return
        if self.client is not None or self.adopted:  # one adopter: another run holds it
            try:
                conn.sendall(b'{"busy": true}\n')
            except OSError:
                pass
            conn.close()
            return
        self.client = conn


def _same_user(conn: socket.socket) -> bool:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return False
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def main() -> int:
    order = json.loads(sys.stdin.read())
    folder = order["folder"]
    os.chdir(folder)
    try:
        os.unlink(SOCKET)
    except OSError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(SOCKET)  # 0600 from the start (the folder is 0700 too)
    finally:
        os.umask(old)
    os.chmod(SOCKET, 0o600)
    listener.listen(4)
    inode = os.stat(SOCKET).st_ino
    keeper = Keeper(order)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        keeper.spawn()
        with os.fdopen(_private(PIDFILE + ".tmp", os.O_WRONLY | os.O_TRUNC), "w") as f:
            f.write("%d\n" % os.getpid())
        os.replace(PIDFILE + ".tmp", PIDFILE)
        keeper.serve(listener)
    finally:
        keeper.kill_all()
        listener.close()
        try:
            if os.stat(SOCKET).st_ino == inode:  # not a later keeper's
                os.unlink(SOCKET)
                os.unlink(PIDFILE)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
