"""The links between the agents of a detached run: followers dial the coordinator (node 0) over TCP.

No console is there to decide, so node 0 does: followers report their processes to it, it sends
them Stop and Start. A Start names commands to run, so both ends prove they hold the run's secret
(it came from the console over SSH and never crosses this link) before anything else:

    coordinator -> {"nonce": Nc}
    follower    -> {"node": NAME, "nonce": Nf, "mac": H(secret, "f" Nc NAME)}
    coordinator -> {"mac": H(secret, "c" Nf NAME)}

after which every line is ``{"s": SEQ, "m": MESSAGE, "t": H(key, DIR SEQ MESSAGE)}`` with the
session key ``H(secret, Nc Nf NAME)``, DIR the line's direction (``c>f`` or ``f>c``) and SEQ
counting up from 0 in each direction, so a line cannot be forged, altered, replayed, reordered, or
reflected back to the end that sent it. The link is authenticated, not encrypted: it runs on the
cluster's own network.

Unauthenticated peers cost the coordinator little: it listens on the address it is given (the
scheduler's), one thread runs every handshake (non-blocking sockets under a selector), a handshake
has one deadline for all of it, at most ``PENDING_MAX`` are in progress, and running out of file
descriptors makes the listener pause, never stop. Only the run's nodes get past the handshake, and
only they cost a thread (their link's reader).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import os
import queue
import selectors
import socket
import threading
import time
import traceback

from ..streams import ACCEPT_BACKOFF_S, Backoff, LineSplitter, LineTooLong, close_socket, note, read_lines

# The whole handshake (nonce out, hello in, proof out), however the peer paces its bytes: a
# connection that sends one byte every few seconds is cut off all the same (a per-read timeout
# would keep it for ever). A follower needs one round trip.
HANDSHAKE_S = 10.0
# Handshakes in progress at once, each one socket: well below the 1,024 descriptors an agent often
# has (its ranks' logs and pipes need theirs), well above the followers that dial at once. Over the
# cap one is closed at once: the oldest of the address that holds the most, so a flood of
# connections that never authenticate cannot hold the port or the agent's descriptors, and pushes
# out its own connections rather than a follower's (one handshake from its address).
PENDING_MAX = 64
HELLO_MAX = 4096  # bytes in a handshake line (a hello is about 200)
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
        sock: socket.socket,
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
        close_socket(self.sock)


class _Handshake:
    """A connection that has not proved it holds the secret yet."""

    def __init__(self, conn: socket.socket, host: str, nonce: str, deadline: float) -> None:
        self.conn = conn
        self.host = host  # the peer's address
        self.nonce = nonce
        self.deadline = deadline
        self.split = LineSplitter(HELLO_MAX)


class CoordServer:
    """Node 0's listener on ``host``: each authenticated follower becomes a PeerLink, announced as
    ("peer_up", link, None). One thread serves the port and every handshake."""

    def __init__(self, secret: str, nodes: list, inbox: queue.Queue, host: str = "0.0.0.0") -> None:
        self.secret = secret.encode()
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
        self._pending: dict = {}  # socket -> _Handshake, oldest first
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
            for h in list(self._pending.values()):
                self._drop(sel, h)
            sel.close()
            self.sock.close()

    def _turn(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        if self._paused_until is not None and now >= self._paused_until:
            sel.register(self.sock, selectors.EVENT_READ)
            self._paused_until = None
        wake = [now + _POLL_S] + [h.deadline for h in self._pending.values()]
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
        for h in [h for h in self._pending.values() if h.deadline <= now]:
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
            if len(self._pending) >= PENDING_MAX:
                self._drop(sel, self._victim())
            nonce = os.urandom(16).hex()
            h = _Handshake(conn, str(addr[0]), nonce, time.monotonic() + HANDSHAKE_S)
            hello = _line({"nonce": nonce})
            try:
                conn.setblocking(False)
                if conn.send(hello) != len(hello):  # a fresh socket takes 50 bytes, or it is broken
                    raise OSError("short send")
                sel.register(conn, selectors.EVENT_READ, h)
            except (OSError, ValueError):
                conn.close()
                continue
            self._pending[conn] = h
        return False

    def _victim(self) -> _Handshake:
        """Over the cap: the oldest handshake of the address that holds the most."""
        counts = collections.Counter(h.host for h in self._pending.values())
        most = max(counts.values())
        return next(h for h in self._pending.values() if counts[h.host] == most)

    def _advance(self, sel: selectors.BaseSelector, h: _Handshake) -> None:
        if h.conn not in self._pending:
            return  # dropped earlier in this turn
        try:
            chunk = h.conn.recv(HELLO_MAX)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        try:
            if not chunk:
                raise LinkError("closed during the handshake")
            lines = h.split.feed(chunk)
            if not lines:
                return
            hello = _handshake_obj(lines[0])
            node, nonce_f, mac = str(hello["node"]), str(hello["nonce"]), str(hello["mac"])
            if node not in self.nodes or not hmac.compare_digest(mac, _mac(self.secret, "f", h.nonce, node)):
                raise LinkError("refused")
        except _BAD + (LinkError,):
            self._drop(sel, h)
            return
        del self._pending[h.conn]
        sel.unregister(h.conn)
        self._admit(h, node, nonce_f, _leftover(lines[1:], h.split))

    def _admit(self, h: _Handshake, node: str, nonce_f: str, pending: bytes) -> None:
        conn = h.conn
        try:
            conn.settimeout(max(0.1, h.deadline - time.monotonic()))
            conn.sendall(_line({"mac": _mac(self.secret, "c", nonce_f, node)}))
            conn.settimeout(None)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        except OSError:
            conn.close()
            return
        key = _session_key(self.secret, h.nonce, nonce_f, node)
        link = PeerLink(conn, key, node, self.inbox, coordinator=True, pending=pending)
        self.inbox.put(("peer_up", link, None))
        try:
            link.start()
        except RuntimeError as exc:  # no thread left to start: the link ends as if it broke
            note("coordinator port: the link of %s could not start (%s)" % (node, exc))
            link.close()
            self.inbox.put(("peer", link, None))

    def _drop(self, sel: selectors.BaseSelector, h: _Handshake) -> None:
        if self._pending.pop(h.conn, None) is None:
            return
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


def _recv_obj(conn: socket.socket, split: LineSplitter, lines: list, deadline: float) -> dict:
    while not lines:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LinkError("the coordinator's handshake took too long")
        conn.settimeout(left)
        chunk = conn.recv(HELLO_MAX)
        if not chunk:
            raise LinkError("closed during the handshake")
        lines.extend(split.feed(chunk))
    return _handshake_obj(lines.pop(0))


def dial(
    host: str, port: int, secret: str, node: str, inbox: queue.Queue, timeout_s: float = 10.0
) -> PeerLink:
    """Connect a follower to its coordinator, the handshake done within ``timeout_s`` in all;
    raises OSError or LinkError."""
    deadline = time.monotonic() + timeout_s
    key_secret = secret.encode()
    conn = socket.create_connection((host, port), timeout=timeout_s)
    split = LineSplitter(HELLO_MAX)
    lines: list = []
    try:
        nonce_c = str(_recv_obj(conn, split, lines, deadline)["nonce"])
        nonce_f = os.urandom(16).hex()
        conn.sendall(_line({"node": node, "nonce": nonce_f, "mac": _mac(key_secret, "f", nonce_c, node)}))
        answer = _recv_obj(conn, split, lines, deadline)
        if not hmac.compare_digest(str(answer.get("mac", "")), _mac(key_secret, "c", nonce_f, node)):
            raise LinkError("the coordinator did not prove it holds the run's secret")
        conn.settimeout(None)
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
