"""TLS for mscon's TCP links: the Slurm dial-back (``dial.py``) and a detached run's coordinator
link (``detached/coord.py``); the console's end of the dial uses the same contexts.

The console makes one key and one self-signed certificate per run and hands both over the channel
that is already trusted (SSH stdin, or the srun step's environment). Every end presents that
certificate and accepts only a peer that presents it too (mutual, TLS 1.2 at least): holding the
run's key is the proof. The peer is pinned twice: the run's certificate is the only trust anchor,
and the peer's certificate must be exactly it (DER bytes equal).

:class:`TlsSock` makes one TLS connection usable from two threads (a reader and writers): OpenSSL
forbids reading and writing one connection at the same time, so each TLS call is made under a
lock with the socket non-blocking, and the waiting for bytes is done outside it.

Stdlib only, Python 3.8+. Self-contained (no imports of mscon): the Slurm boot runs this source
before anything else reaches the node.
"""

import os
import select
import socket
import ssl
import sys
import tempfile
import threading
import time

_CHUNK = 1 << 16  # bytes per TLS write; a retried write passes the same bytes again


class NotPinned(ssl.SSLError):
    """The peer's certificate is not the run's."""


def _context(server, cert, key):  # noqa: ANN001, ANN202
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # pinned to the run's certificate, whatever name it is reached by
    ctx.verify_mode = ssl.CERT_REQUIRED  # both ways: a server asks for the client's certificate
    ctx.load_verify_locations(cadata=cert)  # the one trust anchor: the run's own certificate
    if hasattr(ctx, "num_tickets") and server:
        ctx.num_tickets = 0  # no resumption: a ticket is one more secret to keep
    _load_key(ctx, cert, key)
    return ctx


def _load_key(ctx, cert, key) -> None:  # noqa: ANN001
    """``load_cert_chain`` reads files only, so the key goes into an anonymous file in memory
    (memfd), read back through /proc/self/fd: it has no name in any folder, never touches a disk
    and goes with the descriptor, even if the process is killed. Without memfd (an interpreter
    built on a glibc before 2.27, or no /proc): :func:`_load_from_private_folder`."""
    pem = (cert.strip() + "\n" + key.strip() + "\n").encode("ascii")
    fd = _memory_file(pem)
    if fd is None:
        _load_from_private_folder(ctx, pem)
        return
    try:
        ctx.load_cert_chain("/proc/self/fd/%d" % fd)
    finally:
        os.close(fd)


def _memory_file(data):  # noqa: ANN001, ANN202
    """A descriptor of an anonymous in-memory file holding ``data`` that OpenSSL can open by
    path, or None where the system has none."""
    try:
        fd = os.memfd_create("mscon-tls")  # close-on-exec: no child inherits it
    except (AttributeError, OSError):
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if os.path.exists("/proc/self/fd/%d" % fd):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _private_base():  # noqa: ANN202
    """This user's own 0700 folder for the fallback: ~/.cache/mscon (the nodes' agent cache, the
    runs' root), never a temp folder other users share."""
    base = os.path.join(os.path.expanduser("~"), ".cache", "mscon")
    os.makedirs(base, 0o700, exist_ok=True)
    st = os.lstat(base)
    if not os.path.isdir(base) or os.path.islink(base) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError("%s is not this user's private folder (0700): no TLS key goes there" % base)
    return base


def _load_from_private_folder(ctx, pem) -> None:  # noqa: ANN001
    """The fallback: a 0600 file in a fresh 0700 folder under :func:`_private_base`, removed once
    OpenSSL has read it. A removal that fails is said: raised if all else went well, else written
    to stderr while the first error goes on."""
    folder = tempfile.mkdtemp(prefix=".tls-", dir=_private_base())  # 0700, a fresh name
    path = os.path.join(folder, "run.pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        ctx.load_cert_chain(path)
    except BaseException:
        left = _remove(path, folder)
        if left:
            sys.stderr.write("mscon: %s\n" % left)
        raise
    left = _remove(path, folder)
    if left:
        raise OSError(left)


def _remove(path, folder):  # noqa: ANN001, ANN202
    """Remove the key file and its folder; what could not be removed, in one line (None: all)."""
    failed = []
    for remove, what in ((os.unlink, path), (os.rmdir, folder)):
        try:
            remove(what)
        except FileNotFoundError:
            pass
        except OSError as exc:
            failed.append("%s (%s)" % (what, exc.strerror or exc))
    if not failed:
        return None
    return "could not remove the run's TLS key file: " + "; ".join(failed)


def server_context(cert, key):  # noqa: ANN001, ANN201
    """The listening end's context (``cert``, ``key``: PEM text)."""
    return _context(True, cert, key)


def client_context(cert, key):  # noqa: ANN001, ANN201
    """The dialling end's context (``cert``, ``key``: PEM text)."""
    return _context(False, cert, key)


def check_peer(ssl_obj, cert) -> None:  # noqa: ANN001
    """Raise NotPinned unless the peer of ``ssl_obj`` (an SSLSocket or SSLObject whose handshake is
    done) presented exactly ``cert``."""
    if ssl_obj.getpeercert(True) != ssl.PEM_cert_to_DER_cert(cert.strip()):
        raise NotPinned("the peer does not hold the run's certificate")


def _wait(fd, events, deadline):  # noqa: ANN001, ANN202
    """Wait until ``fd`` is ready for ``events`` (poll: descriptors may be past 1,024), at most
    until ``deadline`` (monotonic; None: no limit). False: the deadline passed."""
    poll = select.poll()
    poll.register(fd, events)
    while True:
        if deadline is None:
            ms = None
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ms = int(left * 1000) + 1
        try:
            poll.poll(ms)
            return True
        except InterruptedError:
            continue


def handshake(sock, deadline) -> None:  # noqa: ANN001
    """Finish the TLS handshake of SSLSocket ``sock`` (made with do_handshake_on_connect False)
    by ``deadline``, however the peer paces its bytes; socket.timeout past it."""
    sock.setblocking(False)
    while True:
        try:
            sock.do_handshake()
            return
        except ssl.SSLWantReadError:
            events = select.POLLIN
        except ssl.SSLWantWriteError:
            events = select.POLLOUT
        if not _wait(sock.fileno(), events, deadline):
            raise socket.timeout("the TLS handshake took too long")


def connect(host, port, cert, key, timeout_s, source=None):  # noqa: ANN001, ANN201
    """A TCP connection to ``host``:``port`` with its TLS handshake done and the peer checked,
    all within ``timeout_s``; the SSLSocket (non-blocking). OSError (ssl.SSLError, NotPinned,
    socket.timeout) otherwise."""
    deadline = time.monotonic() + timeout_s
    raw = socket.create_connection((host, port), timeout_s, source)
    try:
        sock = client_context(cert, key).wrap_socket(raw, do_handshake_on_connect=False)
    except BaseException:
        raw.close()
        raise
    try:
        handshake(sock, deadline)
        check_peer(sock, cert)
    except BaseException:
        sock.close()
        raise
    return sock


# What a listener does to a connection it pushes out before the handshake is done (agent/gate.py:
# a flood from the dialler's own address): the dialler tries again rather than giving up.
_CLOSED = (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError, EOFError)


def dial(host, port, cert, key, timeout_s, first=None, source=None):  # noqa: ANN001, ANN201
    """:func:`connect`, then ``first(sock)`` (the first exchange, up to the listener's first
    answer; it raises ConnectionError or EOFError if the connection closed), tried again while the
    listener closes the connection before that answer, all within ``timeout_s``. ``(sock,
    first's result)``, or the SSLSocket alone without ``first``. The last error past the deadline;
    any other error at once (a peer that is not the run's is not tried again)."""
    deadline = time.monotonic() + timeout_s
    pause = 0.05
    while True:
        try:
            sock = connect(host, port, cert, key, max(0.1, deadline - time.monotonic()), source)
            if first is None:
                return sock
            try:
                return sock, first(sock)
            except BaseException:
                sock.close()
                raise
        except _CLOSED:
            if time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)
            pause = min(1.0, pause * 2)


class TlsSock:
    """An SSLSocket whose handshake is done, for one reading thread and any writing threads:
    ``recv``, ``sendall``, ``close`` as a socket's (a closed or broken link reads b"")."""

    def __init__(self, sock) -> None:  # noqa: ANN001
        sock.setblocking(False)
        self.sock = sock
        self._fd = sock.fileno()
        self._tls = threading.Lock()  # one TLS call at a time, never held while waiting
        self._send = threading.Lock()  # one message's bytes together
        self.closed = False

    def fileno(self) -> int:
        return -1 if self.closed else self._fd

    def setsockopt(self, *args) -> None:  # noqa: ANN002
        self.sock.setsockopt(*args)

    def getpeername(self):  # noqa: ANN201
        return self.sock.getpeername()

    def recv(self, n, deadline=None):  # noqa: ANN001, ANN201
        """Up to ``n`` bytes (b"": the end); socket.timeout if none came by ``deadline``."""
        while True:
            with self._tls:
                if self.closed:
                    return b""
                try:
                    return self.sock.recv(n)
                except ssl.SSLWantReadError:
                    events = select.POLLIN
                except ssl.SSLWantWriteError:
                    events = select.POLLOUT
                except (OSError, ValueError):
                    return b""  # reset, or a TLS error: the end of this link
            if not _wait(self._fd, events, deadline):
                raise socket.timeout("nothing came in time")

    def sendall(self, data, timeout_s=None) -> None:  # noqa: ANN001
        """All of ``data``, or OSError (socket.timeout past ``timeout_s``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        view = memoryview(data)
        with self._send:
            while view:
                chunk = view[:_CHUNK]
                with self._tls:
                    if self.closed:
                        raise OSError("the link is closed")
                    try:
                        view = view[self.sock.send(chunk) :]
                        continue
                    except ssl.SSLWantWriteError:
                        events, wait_until = select.POLLOUT, deadline
                    except ssl.SSLWantReadError:  # the reader takes those bytes: look again soon
                        events, wait_until = select.POLLIN, time.monotonic() + 0.05
                if not _wait(self._fd, events, wait_until) and wait_until is deadline:
                    raise socket.timeout("the peer took nothing for %s s" % timeout_s)

    def close(self) -> None:
        """Shut the connection down both ways (a reader waiting on it wakes up), then close."""
        with self._tls:
            if self.closed:
                return
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
