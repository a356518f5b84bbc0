"""The links between the agents of a detached run: followers dial the coordinator (node 0) over TCP.

No console is there to decide, so node 0 does: followers report their processes to it, it sends
them Stop and Start. Every link is TLS (``agent/tls.py``): both ends present the run's certificate,
made by the console and handed to each agent in its Detach over SSH, and accept only a peer that
presents it, so nothing on the link (node names, pids, exit codes, error text) is readable on the
network and nobody without the run's key gets in. Inside TLS, as a second lock, both ends prove
they hold the run's secret (it came over SSH too and never crosses this link):

    coordinator -> {"nonce": Nc}
    follower    -> {"node": NAME, "nonce": Nf, "mac": H(secret, "f" Nc NAME)}
    coordinator -> {"mac": H(secret, "c" Nf NAME)}

after which every line is ``{"s": SEQ, "m": MESSAGE, "t": H(key, DIR SEQ MESSAGE)}`` with the
session key ``H(secret, Nc Nf NAME)``, DIR the line's direction (``c>f`` or ``f>c``) and SEQ
counting up from 0 in each direction, so a line cannot be forged, altered, replayed, reordered, or
reflected back to the end that sent it, even by a party that holds the certificate.

Unauthenticated peers cost the coordinator little: it listens on the address it is given (the
scheduler's; never every address), one thread runs every handshake, TLS's and the secret's
(non-blocking sockets under a selector), a handshake has one deadline for all of it, at most
``PENDING_MAX`` are in progress (``agent/gate.py``, the limits the console's Slurm port keeps too),
and running out of file descriptors makes the listener pause, never stop. Only the run's nodes get
past the handshake, and only they cost a thread (their link's reader).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import selectors
import socket
import ssl
import threading
import time
import traceback

from .. import tls
from ..gate import HANDSHAKE_S, HELLO_MAX, PENDING_MAX, Pending
from ..streams import ACCEPT_BACKOFF_S, Backoff, LineSplitter, LineTooLong, note, read_lines

LINE_MAX = 16 << 20  # bytes in a signed line: a Start carries every rank's argv and env
_ACCEPT_BATCH = 64  # connections taken per wake-up before the handshakes get their turn
_POLL_S = 0.25  # how soon the handshake loop notices close()

_TO_FOLLOWER, _TO_COORDINATOR = "c>f", "f>c"  # the direction label each line's MAC covers
# What a peer's bytes can raise while they are read: the handshake is refused, the link ends.
_BAD = (OSError, ValueError, KeyError, TypeError, RecursionError, LineTooLong)


class LinkError(Exception):
    pass


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def _session_key(secret: bytes, nonce_c: str, nonce_f: str, node: str) -> bytes:
    return hashlib.sha256(secret + ("\0%s\0%s\0%s" % (nonce_c, nonce_f, node)).encode()).digest()


def _line(obj: dict) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _handshake_obj(raw: bytes) -> dict:
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise LinkError("bad handshake")
    return obj


def _leftover(lines: list, split: LineSplitter) -> bytes:
    """What the handshake read past its last line: the link's first bytes."""
    return b"".join(line + b"\n" for line in lines) + split.rest()


class PeerLink:
    """One authenticated link; received messages go to ``inbox`` as ("peer", self, dict | None)."""

    def __init__(
        self,
        sock: tls.TlsSock,
        key: bytes,
        node: str,
        inbox: queue.Queue,
        coordinator: bool,
        pending: bytes = b"",
    ) -> None:
        self.sock = sock
        self.key = key
        self.node = node  # the follower's name (on both ends)
        self.inbox = inbox
        # This end's role labels what it signs and what it accepts: its own lines, sent back to it,
        # fail their check.
        self._send_dir = _TO_FOLLOWER if coordinator else _TO_COORDINATOR
        self._recv_dir = _TO_COORDINATOR if coordinator else _TO_FOLLOWER
        self._send_seq = 0
        self._recv_seq = 0
        self._lock = threading.Lock()
        self.closed = False
        self._pending = pending  # what the handshake read past its last line

    def start(self) -> None:
        threading.Thread(target=self._read, name="peer-%s" % self.node, daemon=True).start()

    def send(self, msg: dict) -> bool:
        with self._lock:
            if self.closed:
                return False
            body = json.dumps(msg, separators=(",", ":"), sort_keys=True)
            tag = _mac(self.key, self._send_dir, str(self._send_seq), body)
            line = json.dumps({"s": self._send_seq, "m": body, "t": tag})
            try:
                self.sock.sendall(line.encode() + b"\n")
            except OSError:
                self.closed = True
                return False
            self._send_seq += 1
            return True

    def _recv(self, n: int) -> bytes:
        first, self._pending = self._pending, b""
        return first or self.sock.recv(n)

    def _read(self) -> None:
        try:
            read_lines(self._recv, self._take, LINE_MAX)
        except _BAD + (LinkError,):
            pass
        self.close()
        self.inbox.put(("peer", self, None))

    def _take(self, raw: str) -> None:
        outer = json.loads(raw)
        if not isinstance(outer, dict):
            raise LinkError("not a signed line")
        body, seq, tag = outer["m"], outer["s"], outer["t"]
        if (
            not isinstance(body, str)
            or not isinstance(tag, str)
            or seq != self._recv_seq
            or not hmac.compare_digest(tag, _mac(self.key, self._recv_dir, str(seq), body))
        ):
            raise LinkError("a line failed its check")
        msg = json.loads(body)
        if not isinstance(msg, dict):
            raise LinkError("not a message")
        self._recv_seq += 1
        self.inbox.put(("peer", self, msg))

    def close(self) -> None:
        self.closed = True
        self.sock.close()  # TlsSock: shut down both ways first, so the reader wakes up


class _Handshake:
    """A connection that has not proved it holds the run's certificate and secret yet."""

    def __init__(self, conn: ssl.SSLSocket, host: str, nonce: str, deadline: float) -> None:
        self.conn = conn
        self.host = host  # the peer's address
        self.nonce = nonce
        self.deadline = deadline
        self.began = False  # a whole, valid TLS ClientHello came and was answered
        self.tls_done = False
        self.out = b""  # what is still to be sent (the nonce line)
        self.events = selectors.EVENT_READ
        self.split = LineSplitter(HELLO_MAX)


def _no_material(cert: str, key: str) -> None:
    if not cert or not key:
        raise LinkError("no TLS material for the coordinator's link (the Detach's tls_cert, tls_key)")


class CoordServer:
    """Node 0's listener on ``host`` (an address of this node's: never every address), TLS with
    the run's certificate ``cert`` and ``key`` (PEM): each authenticated follower becomes a
    PeerLink, announced as ("peer_up", link, None). One thread serves the port and every
    handshake."""

    def __init__(
        self, secret: str, nodes: list, inbox: queue.Queue, host: str = "", *, cert: str = "", key: str = ""
    ) -> None:
        if not host or host in ("0.0.0.0", "::"):
            raise LinkError("the coordinator listens on the scheduler's address only; none given")
        _no_material(cert, key)
        self.secret = secret.encode()
        self.cert = cert
        self.ctx = tls.server_context(cert, key)
        self.nodes = set(nodes)
        self.inbox = inbox
        family, _, _, _, addr = socket.getaddrinfo(host, 0, 0, socket.SOCK_STREAM)[0]
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(addr)
            # A burst waits in the kernel's queue (no descriptor of ours) rather than being refused.
            self.sock.listen(1024)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.port = self.sock.getsockname()[1]
        self._pending = Pending()  # of _Handshake, oldest first
        self._backoff = Backoff("coordinator port %d" % self.port)
        self._paused_until: float | None = None  # out of descriptors: the port is not watched till then
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="coord-accept", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the loop

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        try:
            while not self._closed:
                try:
                    self._turn(sel)
                except Exception:  # noqa: BLE001 - a bug here must not end the listener
                    note("coordinator port: %s" % traceback.format_exc().strip())
                    time.sleep(ACCEPT_BACKOFF_S)  # a back-off: nothing waits on it
        finally:
            for h in self._pending.keys():
                self._drop(sel, h)
            sel.close()
            self.sock.close()

    def _turn(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        if self._paused_until is not None and now >= self._paused_until:
            sel.register(self.sock, selectors.EVENT_READ)
            self._paused_until = None
        wake = [now + _POLL_S] + [h.deadline for h in self._pending.keys()]
        if self._paused_until is not None:
            wake.append(self._paused_until)
        for key, _ in sel.select(max(0.0, min(wake) - now)):
            if key.fileobj is self.sock:
                if self._accept(sel):
                    self._paused_until = time.monotonic() + ACCEPT_BACKOFF_S
                    sel.unregister(self.sock)
            else:
                self._advance(sel, key.data)
        now = time.monotonic()
        for h in [h for h in self._pending.keys() if h.deadline <= now]:
            self._drop(sel, h)

    def _accept(self, sel: selectors.BaseSelector) -> bool:
        """Take what waits; True: out of descriptors (or worse), pause the port."""
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, addr = self.sock.accept()
            except BlockingIOError:
                return False
            except OSError as exc:
                if self._backoff.failed(exc):
                    return True
                continue
            self._backoff.accepted()
            try:
                conn.setblocking(False)
                wrapped = self.ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError):
                conn.close()
                continue
            h = _Handshake(wrapped, str(addr[0]), os.urandom(16).hex(), time.monotonic() + HANDSHAKE_S)
            try:
                self._hello(h)  # its ClientHello may be here already: then it is known to be one
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            except _BAD:
                wrapped.close()
                continue
            victims = self._pending.add(h, h.host, PENDING_MAX, valid=h.began)
            for victim in victims:
                self._close(sel, victim)
            if h in victims:
                continue  # every handshake in progress holds the run's certificate
            try:
                sel.register(wrapped, selectors.EVENT_READ, h)
            except (OSError, ValueError):
                self._drop(sel, h)
                continue
            self._advance(sel, h)  # the peer's hello may be there already
        return False

    def _advance(self, sel: selectors.BaseSelector, h: _Handshake) -> None:
        """One step of a handshake: TLS's, the nonce out, the hello in; each waits for its bytes."""
        if h not in self._pending:
            return  # dropped earlier in this turn
        try:
            want = self._step(sel, h)
        except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            want = selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            want = selectors.EVENT_WRITE
        except _BAD + (LinkError,):
            self._drop(sel, h)
            return
        if want is None:
            return
        if want != h.events:
            h.events = want
            sel.modify(h.conn, want, h)

    def _step(self, sel: selectors.BaseSelector, h: _Handshake) -> int | None:
        """Advance ``h`` as far as its bytes allow: the selector event it waits for, or None (it
        was admitted). The ssl module's Want errors say what it waits for too."""
        if not h.tls_done:
            self._hello(h)
            tls.check_peer(h.conn, self.cert)  # NotPinned: an SSLError, refused like the rest
            self._pending.trust(h)  # a holder of the run's certificate: no flood pushes it out
            h.tls_done = True
            h.out = _line({"nonce": h.nonce})
        while h.out:
            h.out = h.out[h.conn.send(h.out) :]
        while True:
            chunk = h.conn.recv(HELLO_MAX)  # SSLWantReadError: nothing more yet
            if not chunk:
                raise LinkError("closed during the handshake")
            lines = h.split.feed(chunk)
            if lines:
                break
        hello = _handshake_obj(lines[0])
        node, nonce_f, mac = str(hello["node"]), str(hello["nonce"]), str(hello["mac"])
        if node not in self.nodes or not hmac.compare_digest(mac, _mac(self.secret, "f", h.nonce, node)):
            raise LinkError("refused")
        self._pending.discard(h)
        sel.unregister(h.conn)
        self._admit(h, node, nonce_f, _leftover(lines[1:], h.split))
        return None

    def _hello(self, h: _Handshake) -> None:
        """One step of TLS's handshake; the first that answers a whole, valid ClientHello (a cipher
        is chosen then) marks ``h`` as one a flood of silent or garbled connections cannot push
        out (agent/gate.py). Raises what do_handshake raises."""
        try:
            h.conn.do_handshake()
        finally:
            if not h.began and h.conn.cipher() is not None:
                h.began = True
                self._pending.began(h)

    def _admit(self, h: _Handshake, node: str, nonce_f: str, pending: bytes) -> None:
        link_sock = tls.TlsSock(h.conn)
        try:
            link_sock.sendall(
                _line({"mac": _mac(self.secret, "c", nonce_f, node)}), max(0.1, h.deadline - time.monotonic())
            )
            link_sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        except OSError:
            link_sock.close()
            return
        key = _session_key(self.secret, h.nonce, nonce_f, node)
        link = PeerLink(link_sock, key, node, self.inbox, coordinator=True, pending=pending)
        self.inbox.put(("peer_up", link, None))
        try:
            link.start()
        except RuntimeError as exc:  # no thread left to start: the link ends as if it broke
            note("coordinator port: the link of %s could not start (%s)" % (node, exc))
            link.close()
            self.inbox.put(("peer", link, None))

    def _drop(self, sel: selectors.BaseSelector, h: _Handshake) -> None:
        if self._pending.discard(h):
            self._close(sel, h)

    def _close(self, sel: selectors.BaseSelector, h: _Handshake) -> None:
        try:
            sel.unregister(h.conn)
        except (KeyError, ValueError):
            pass
        h.conn.close()

    def close(self) -> None:
        """Stop listening (the loop closes the port and every handshake within _POLL_S)."""
        self._closed = True
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=_POLL_S * 4)


def _recv_line(
    conn: tls.TlsSock, split: LineSplitter, lines: list, deadline: float, closed: Exception
) -> None:
    """Read until ``lines`` holds a whole line; ``closed`` is raised if the peer closes first."""
    while not lines:
        try:
            chunk = conn.recv(HELLO_MAX, deadline)
        except socket.timeout:
            raise LinkError("the coordinator's handshake took too long") from None
        if not chunk:
            raise closed
        lines.extend(split.feed(chunk))


def _recv_obj(conn: tls.TlsSock, split: LineSplitter, lines: list, deadline: float) -> dict:
    _recv_line(conn, split, lines, deadline, LinkError("closed during the handshake"))
    return _handshake_obj(lines.pop(0))


def dial(
    host: str,
    port: int,
    secret: str,
    node: str,
    inbox: queue.Queue,
    timeout_s: float = 10.0,
    *,
    cert: str = "",
    key: str = "",
) -> PeerLink:
    """Connect a follower to its coordinator over TLS with the run's certificate ``cert`` and
    ``key`` (PEM), the handshakes done within ``timeout_s`` in all; raises OSError or LinkError."""
    _no_material(cert, key)
    deadline = time.monotonic() + timeout_s
    key_secret = secret.encode()

    def first(sock: ssl.SSLSocket) -> tuple:
        """The coordinator's nonce: a connection closed before it (pushed out by a flood) is
        dialled again (tls.dial)."""
        split, lines = LineSplitter(HELLO_MAX), []  # type: ignore[var-annotated]
        conn = tls.TlsSock(sock)
        _recv_line(conn, split, lines, deadline, EOFError("closed before the coordinator's nonce"))
        return conn, split, lines

    _sock, (conn, split, lines) = tls.dial(host, port, cert, key, timeout_s, first)
    try:
        nonce_c = str(_handshake_obj(lines.pop(0))["nonce"])
        nonce_f = os.urandom(16).hex()
        hello = _line({"node": node, "nonce": nonce_f, "mac": _mac(key_secret, "f", nonce_c, node)})
        conn.sendall(hello, max(0.1, deadline - time.monotonic()))
        answer = _recv_obj(conn, split, lines, deadline)
        if not hmac.compare_digest(str(answer.get("mac", "")), _mac(key_secret, "c", nonce_f, node)):
            raise LinkError("the coordinator did not prove it holds the run's secret")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    except (OSError, LinkError):
        conn.close()
        raise
    except _BAD as exc:
        conn.close()
        raise LinkError("bad handshake from the coordinator: %s" % exc) from exc
    link = PeerLink(
        conn,
        _session_key(key_secret, nonce_c, nonce_f, node),
        node,
        inbox,
        coordinator=False,
        pending=_leftover(lines, split),
    )
    link.start()
    return link


def dial_within(
    host: str,
    port: int,
    secret: str,
    node: str,
    inbox: queue.Queue,
    deadline: float,
    *,
    cert: str = "",
    key: str = "",
) -> PeerLink:
    """:func:`dial`, tried again after any refusal (reset, closed, timed out, a failed handshake:
    a flood at the coordinator's port) with a growing pause, until ``deadline`` (monotonic; a
    follower's: its watchdog's). The last error past it."""
    pause = 0.05
    while True:
        try:
            return dial(
                host, port, secret, node, inbox, max(0.5, deadline - time.monotonic()), cert=cert, key=key
            )
        except (OSError, LinkError):
            if time.monotonic() + pause >= deadline:
                raise
        time.sleep(pause)  # a back-off between tries, not a synchronisation
        pause = min(1.0, pause * 2)
