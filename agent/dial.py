"""The node side of the Slurm transport: a TCP channel back to the console instead of SSH.

``srun`` starts one task per node running a short, fixed boot (``console/transport/slurm_dial.py``:
``DIAL_BOOT``) that connects to the console, authenticates both ways (HMAC-SHA256 over two fresh
nonces with the per-run key from the environment: the key itself never crosses the wire),
receives this module's source over the same connection and calls :func:`serve`. Nothing of the
agent needs to be on the node beforehand: no shared file system is assumed.

:func:`serve` speaks a small control protocol (JSON lines, ``{"id": N, "op": ...}``, each
answered by ``{"id": N, ...}``) on that connection:

* ``exists`` / ``put``: files under the node's mscon folder (``layout.py``), for the agent
  bundle and the workdir archive; paths are relative, plain names only, written atomically.
* ``agent``: open a second connection, authenticate it, present the console's one-time token,
  and start the normal agent (the same boot as over SSH) with that socket as its stdin and
  stdout. The agent runs unchanged: it reads fd 0, writes fd 1, and stops its ranks when the
  connection closes. Its stderr and its exit come back as ``stderr`` / ``exited`` notices.
* ``fetch``: a run folder as a tar.gz stream (``chunk`` answers, then ``ok``); regular files and
  folders with plain names only, symbolic links never followed; less ``layout.not_fetched``
  (``include``: the parts asked for, ``layout.FETCHED_ON_REQUEST``).
* ``kill``: kill the agent now (its ranks die with it: parent-death signal).

When the control connection ends (the console closed it, or died), the agent's connection is
shut down too, the agent stops its ranks, and this process exits: that ends the srun step.
Stdlib only, Python 3.8+.
"""

import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading

try:
    from .layout import cache_folder, fetched_entries, not_fetched, plain, private_dirs, private_fd
except ImportError:  # exec'd by the Slurm boot, not imported: layout.py's source came first
    pass

PROTOCOL = "MSCON-DIAL 1"
CHUNK = 1 << 20  # bytes per fetch chunk (base64 in one JSON line)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
AGENT_STOP_WAIT_S = 120.0  # after the console is gone: the agent's grace period and then some


def mac(key, *parts):  # noqa: ANN001, ANN201
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def handshake(sock, rfile, key, role):  # noqa: ANN001, ANN201
    """The node's side of the mutual challenge-response (the boot code does the same inline)."""
    nonce = os.urandom(16).hex()
    sock.sendall(("%s %s %s\n" % (PROTOCOL, role, nonce)).encode())
    words = rfile.readline(512).decode("ascii", "replace").split()
    if len(words) != 2 or not hmac.compare_digest(words[1], mac(key, "console", nonce, words[0])):
        raise OSError("the console did not authenticate")
    sock.sendall((mac(key, "node", words[0], nonce) + "\n").encode())


class Dial:
    def __init__(self, sock, rfile, key) -> None:  # noqa: ANN001
        self.sock = sock
        self.rfile = rfile
        self.key = key
        self.lock = threading.Lock()
        self.home = os.path.expanduser("~")
        self.root = cache_folder(self.home)
        self.agent = None  # the agent's Popen
        self.agent_sock = None
        self.uploads = {}  # path -> (tmp path, file)

    # ------------------------------------------------------------ wire

    def send(self, obj) -> None:  # noqa: ANN001
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass  # the reader sees the connection end

    def path(self, rel):  # noqa: ANN001, ANN201
        """``rel`` under the mscon folder; every component a plain name (else ValueError)."""
        parts = rel.split("/") if isinstance(rel, str) else [None]
        if not all(plain(p) for p in parts):
            raise ValueError("unsafe path %r" % (rel,))
        return os.path.join(self.root, *parts)

    # ------------------------------------------------------------ main loop

    def serve(self) -> int:
        self.send(
            {
                "op": "hello",
                "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                "hostname": socket.gethostname(),
                "home": self.home,
                "pid": os.getpid(),
                "python": sys.version.split()[0],
            }
        )
        while True:
            try:
                line = self.rfile.readline()
            except OSError:
                line = b""
            if not line:
                break
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("not an object")
            except ValueError:
                continue
            rid = req.get("id")
            try:
                self.handle(rid, req)
            except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a crash
                self.send({"id": rid, "error": "%s: %s" % (type(exc).__name__, exc)})
        self.stop_agent()
        return 0

    def handle(self, rid, req) -> None:  # noqa: ANN001
        op = req.get("op")
        if op == "exists":
            self.send({"id": rid, "ok": True, "exists": os.path.lexists(self.path(req["path"]))})
        elif op == "put":
            self.put(req["path"], base64.b64decode(req.get("data", "")), bool(req.get("last")))
            self.send({"id": rid, "ok": True})
        elif op == "agent":
            pid = self.start_agent(str(req["token"]), str(req["code"]))
            self.send({"id": rid, "ok": True, "pid": pid})
        elif op == "kill":
            if self.agent is not None and self.agent.poll() is None:
                self.agent.kill()
            self.send({"id": rid, "ok": True})
        elif op == "fetch":
            self.fetch(rid, self.path(req["path"]), tuple(req.get("include") or ()))
            self.send({"id": rid, "ok": True})
        else:
            self.send({"id": rid, "error": "unknown op %r" % (op,)})

    # ------------------------------------------------------------ files

    def put(self, rel, data, last) -> None:  # noqa: ANN001
        target = self.path(rel)
        if rel not in self.uploads:
            folder = os.path.dirname(target)
            private_dirs(folder)  # 0700, each level made (the agent's, sync/)
            tmp = "%s.tmp-%s" % (target, os.urandom(8).hex())
            fd = private_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW)  # 0600
            self.uploads[rel] = (tmp, os.fdopen(fd, "wb"))
        tmp, f = self.uploads[rel]
        f.write(data)
        if last:
            del self.uploads[rel]
            f.close()
            os.replace(tmp, target)  # atomic: nodes may share a home folder

    def fetch(self, rid, run_dir, include=()) -> None:  # noqa: ANN001
        try:
            fd = os.open(run_dir, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
        except OSError:
            return  # nothing there (or a link): an empty answer
        out = _Chunks(self, rid)
        try:
            with tarfile.open(fileobj=out, mode="w|gz", format=tarfile.PAX_FORMAT) as tar:
                _add_tree(tar, fd, not_fetched(include))
        finally:
            os.close(fd)
        out.flush()

    # ------------------------------------------------------------ the agent

    def start_agent(self, token, code):  # noqa: ANN001, ANN201
        if self.agent is not None and self.agent.poll() is None:
            raise RuntimeError("an agent is running already")
        peer = self.sock.getpeername()
        a = socket.create_connection(peer[:2], 30)
        try:
            rf = a.makefile("rb")
            handshake(a, rf, self.key, "agent")
            rf.close()
            a.sendall((token + "\n").encode())
            a.settimeout(None)
            _keepalive(a)
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=a.fileno(),
                stdout=a.fileno(),
                stderr=subprocess.PIPE,
                cwd=self.home,
                close_fds=True,
                preexec_fn=_dies_with_parent,
            )
        except BaseException:
            a.close()
            raise
        self.agent, self.agent_sock = proc, a
        threading.Thread(target=self._watch_agent, args=(proc, a), name="agent", daemon=True).start()
        return proc.pid

    def _watch_agent(self, proc, a) -> None:  # noqa: ANN001
        while True:
            chunk = proc.stderr.read1(8192) if hasattr(proc.stderr, "read1") else proc.stderr.read(8192)
            if not chunk:
                break
            self.send({"op": "stderr", "data": chunk.decode("utf-8", "replace")})
        code = proc.wait()
        # Only now does the console see the agent's connection end: this process held it too.
        a.close()
        self.send({"op": "exited", "code": code})

    def stop_agent(self) -> None:
        """The console is gone: end the agent's connection (it stops its ranks on EOF), wait."""
        proc, a = self.agent, self.agent_sock
        if proc is None or proc.poll() is not None:
            return
        try:
            a.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            proc.wait(AGENT_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # its ranks die with it (parent-death signal)
            proc.wait()


class _Chunks:
    """A write-only file for tarfile that sends what it gets as base64 chunks."""

    def __init__(self, dial, rid) -> None:  # noqa: ANN001
        self.dial, self.rid, self.buf = dial, rid, bytearray()

    def write(self, data) -> int:  # noqa: ANN001
        self.buf += data
        while len(self.buf) >= CHUNK:
            self._send(bytes(self.buf[:CHUNK]))
            del self.buf[:CHUNK]
        return len(data)

    def flush(self) -> None:
        if self.buf:
            self._send(bytes(self.buf))
            self.buf = bytearray()

    def _send(self, data) -> None:  # noqa: ANN001
        self.dial.send({"id": self.rid, "chunk": base64.b64encode(data).decode("ascii")})


def _add_tree(tar, dir_fd, skip) -> None:  # noqa: ANN001
    """The run folder into ``tar``, as layout.fetched_entries walks it (``skip``: not_fetched)."""
    for path, fd in fetched_entries(dir_fd, skip=skip):
        info = tarfile.TarInfo(path)
        if fd is None:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
            continue
        fst = os.fstat(fd)
        info.size, info.mode, info.mtime = fst.st_size, 0o644, int(fst.st_mtime)
        with os.fdopen(os.dup(fd), "rb") as f:
            tar.addfile(info, _Exactly(f, fst.st_size))


class _Exactly:
    """``size`` bytes of ``f``, zero-padded: a log that shrank meanwhile cannot break the stream."""

    def __init__(self, f, size) -> None:  # noqa: ANN001
        self.f, self.left = f, size

    def read(self, n=-1):  # noqa: ANN001, ANN201
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n)
        data += b"\0" * (n - len(data))
        self.left -= n
        return data


def _dies_with_parent() -> None:
    """In the agent before exec: killed if this dial dies (killed, or its step ended), so it takes
    its ranks with it (their own parent-death signal) instead of running on outside the step."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        pass


def _keepalive(sock) -> None:  # noqa: ANN001
    """A vanished console is noticed by the kernel too, not only by the agent's watchdog."""
    for level, opt, value in (
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), 10),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 5),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
    ):
        if opt is not None:
            try:
                sock.setsockopt(level, opt, value)
            except OSError:
                pass


def serve(sock, rfile, key):  # noqa: ANN001, ANN201
    """Called by the boot code once both sides are authenticated; never returns."""
    sock.settimeout(None)
    _keepalive(sock)
    # srun forwards signals to its tasks: a TERM (scancel, srun interrupted) ends the agent's
    # connection like a closed console does, so its ranks are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sock.shutdown(socket.SHUT_RDWR))
    try:
        code = Dial(sock, rfile, key).serve()
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
