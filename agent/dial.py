"""The node side of the Slurm transport: a TCP channel back to the console instead of SSH.

``srun`` starts one task per node running a short, fixed boot (``console/transport/slurm_dial.py``:
``DIAL_BOOT``, which carries ``tls.py``'s source; it runs isolated from its folder, ``python -I``,
and reads the console's address, the step's key and the run's TLS material from its stdin, one
line srun hands every task, never an environment) that connects to the console
over TLS with the run's certificate and key (mutual, the peer pinned to that certificate:
``tls.py``), authenticates both ways inside it as well (HMAC-SHA256 over two fresh nonces with the
step's key, named by :func:`key_id`: the key itself never crosses the wire), receives this
module's source over the same connection and calls :func:`serve`. The console then hands the dial
a key of the node's own (``key``, once); the dial proves that one on its agent connections.
Nothing of the agent needs to be on the node beforehand: no shared file system is assumed. Every
byte after the TCP handshake is encrypted: the Start messages' argv and env, log lines, the
workdir archive, fetched folders.

:func:`serve` speaks a small control protocol (JSON lines, ``{"id": N, "op": ...}``, each
answered by ``{"id": N, ...}``) on that connection:

* ``key``: the node's own key (hex), once, right after the hello.
* ``exists`` / ``put``: files under the node's mscon folder (``layout.py``), for the agent
  bundle and the workdir archive; paths are relative, plain names only, written atomically.
* ``agent``: open a second TLS connection, authenticate it, present the console's one-time token,
  and start the normal agent (the same boot as over SSH) with one end of a socket pair as its
  stdin and stdout; two threads carry the bytes between that pair and the TLS connection. The
  agent runs unchanged: it reads fd 0, writes fd 1, and stops its ranks when the connection
  closes. Its stderr and its exit come back as ``stderr`` / ``exited`` notices.
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
    from .exit_codes import INTERRUPTED
    from .layout import cache_folder, fetched_entries, not_fetched, plain, private_dirs, private_fd
    from .tls import TlsSock, dial
except ImportError:  # exec'd by the Slurm boot, not imported: their sources came first
    pass

PROTOCOL = "MSCON-DIAL 1"
CHUNK = 1 << 20  # bytes per fetch chunk (base64 in one JSON line)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
AGENT_STOP_WAIT_S = 120.0  # after the console is gone: the agent's grace period and then some


def mac(key, *parts):  # noqa: ANN001, ANN201
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def key_id(key):  # noqa: ANN001, ANN201
    """A key's public name: how the console finds it (console/transport/slurm_keys.py: key_id)."""
    return hashlib.sha256(b"mscon dial key id|" + key).hexdigest()[:32]


def dial_handshake(sock, rfile, key, role):  # noqa: ANN001, ANN201
    """The node's side of the mutual challenge-response inside TLS (the boot does the same inline)."""
    nonce = os.urandom(16).hex()
    sock.sendall(("%s %s %s %s\n" % (PROTOCOL, role, nonce, key_id(key))).encode())
    words = rfile.readline(512).decode("ascii", "replace").split()
    if not words:
        raise EOFError("the console closed the connection before its proof")  # tls.dial tries again
    if len(words) != 2 or not hmac.compare_digest(words[1], mac(key, "console", nonce, words[0])):
        raise OSError("the console did not authenticate")
    sock.sendall((mac(key, "node", words[0], nonce) + "\n").encode())


class Lines:
    """readline() over a TlsSock (a file object over one would read it without its lock)."""

    def __init__(self, sock) -> None:  # noqa: ANN001
        self.sock = sock
        self.buf = b""

    def readline(self, limit=-1):  # noqa: ANN001, ANN201
        """A line with its newline (at most ``limit`` bytes when >= 0); b"": the end."""
        parts, size = [], 0
        while True:
            nl = self.buf.find(b"\n")
            end = len(self.buf) if nl < 0 else nl + 1
            if limit >= 0:
                end = min(end, limit - size)
            parts.append(self.buf[:end])
            size += end
            self.buf = self.buf[end:]
            if (nl >= 0 and end == nl + 1) or size == limit:
                return b"".join(parts)
            self.buf = self.sock.recv(1 << 20)  # all of the last one was taken
            if not self.buf:
                return b"".join(parts)


class Dial:
    def __init__(self, sock, rfile, cert="", tls_key="") -> None:  # noqa: ANN001
        self.sock = sock  # a TlsSock
        self.rfile = rfile  # its Lines
        self.key = None  # the node's own, from the console (``key``): the step's proves boots only
        self.cert, self.tls_key = cert, tls_key  # the run's, PEM: the agent's connection's TLS
        self.lock = threading.Lock()
        self.home = os.path.expanduser("~")
        self.root = cache_folder(self.home)
        self.agent = None  # the agent's Popen
        self.agent_sock = None  # its TlsSock
        self.agent_pair = None  # our end of its stdin and stdout
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
        if op == "key":
            if self.key is not None:
                raise RuntimeError("the node's key was given already")
            self.key = bytes.fromhex(str(req["key"]))
            self.send({"id": rid, "ok": True})
        elif op == "exists":
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
        if self.key is None:
            raise RuntimeError("no key of the node's own yet")
        peer = self.sock.getpeername()

        def prove(raw):  # noqa: ANN001, ANN202
            sock = TlsSock(raw)
            dial_handshake(sock, Lines(sock), self.key, "agent")
            return sock

        _, a = dial(peer[0], peer[1], self.cert, self.tls_key, 30, prove)
        ours = theirs = None
        try:
            a.sendall((token + "\n").encode())
            _keepalive(a)
            # The agent's stdin and stdout: a socket pair, its other end carried over TLS here.
            ours, theirs = socket.socketpair()
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=subprocess.PIPE,
                cwd=self.home,
                close_fds=True,
                preexec_fn=_dies_with_parent,
            )
        except BaseException:
            a.close()
            for s in (ours, theirs):
                if s is not None:
                    s.close()
            raise
        theirs.close()
        self.agent, self.agent_sock, self.agent_pair = proc, a, ours
        threading.Thread(target=_carry_in, args=(a, ours), name="agent-in", daemon=True).start()
        out = threading.Thread(target=_carry_out, args=(ours, a), name="agent-out", daemon=True)
        out.start()
        threading.Thread(
            target=self._watch_agent, args=(proc, a, ours, out), name="agent", daemon=True
        ).start()
        return proc.pid

    def _watch_agent(self, proc, a, ours, out) -> None:  # noqa: ANN001
        while True:
            chunk = proc.stderr.read1(8192) if hasattr(proc.stderr, "read1") else proc.stderr.read(8192)
            if not chunk:
                break
            self.send({"op": "stderr", "data": chunk.decode("utf-8", "replace")})
        code = proc.wait()
        # Only now does the console see the agent's connection end: its last lines carried first
        # (a rank that kept the pair open is not waited for long).
        out.join(5.0)
        a.close()
        ours.close()
        self.send({"op": "exited", "code": code})

    def stop_agent(self) -> None:
        """The console is gone: end the agent's connection (it stops its ranks on EOF), wait."""
        proc, a = self.agent, self.agent_sock
        if proc is None or proc.poll() is not None:
            return
        a.close()
        try:
            self.agent_pair.shutdown(socket.SHUT_WR)  # the agent's stdin ends
        except OSError:
            pass
        try:
            proc.wait(AGENT_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # its ranks die with it (parent-death signal)
            proc.wait()


def _carry_in(a, ours) -> None:  # noqa: ANN001
    """The console's bytes to the agent's stdin; at their end, the agent's stdin ends."""
    _copy(a, ours)
    try:
        ours.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _carry_out(ours, a) -> None:  # noqa: ANN001
    """The agent's stdout to the console, until the agent closes it (it exited)."""
    _copy(ours, a)


def _copy(src, dst) -> None:  # noqa: ANN001
    """``src``'s bytes to ``dst`` until ``src`` ends or either socket fails."""
    try:
        while True:
            chunk = src.recv(1 << 16)
            if not chunk:
                break
            dst.sendall(chunk)
    except OSError:
        pass


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


def _not_dumpable() -> None:
    """The dial holds the node's key and the run's TLS key in memory: its /proc files (mem,
    environ, fd) become root's, so no other process of the user (a rank) can read them. The
    agent it starts is dumpable again (execve resets the flag)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # PR_SET_DUMPABLE
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


def serve(sock, rfile, cert="", tls_key=""):  # noqa: ANN001, ANN201
    """Called by the boot code once both sides are authenticated (``sock``: the SSLSocket, the
    boot's ``rfile`` over it holds nothing more: the console sends nothing until the hello);
    never returns."""
    _keepalive(sock)
    _not_dumpable()
    # srun forwards signals to its tasks: a TERM (scancel, srun interrupted) ends the agent's
    # connection like a closed console does, so its ranks are stopped, not orphaned. A duplicate
    # of the socket: the handler must not wait for the TLS lock the interrupted code may hold.
    waker = socket.socket(fileno=os.dup(sock.fileno()))
    signal.signal(signal.SIGTERM, lambda *_: waker.shutdown(socket.SHUT_RDWR))
    link = TlsSock(sock)
    try:
        code = Dial(link, Lines(link), cert, tls_key).serve()
    except KeyboardInterrupt:
        code = INTERRUPTED
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
