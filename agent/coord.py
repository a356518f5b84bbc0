"""The links between the agents of a detached run: followers dial the coordinator (node 0) over TCP.

No console is there to decide, so node 0 does: followers report their processes to it, it sends
them Stop and Start. A Start names commands to run, so both ends prove they hold the run's secret
(it came from the console over SSH and never crosses this link) before anything else:

    coordinator -> {"nonce": Nc}
    follower    -> {"node": NAME, "nonce": Nf, "mac": H(secret, "f" Nc NAME)}
    coordinator -> {"mac": H(secret, "c" Nf NAME)}

after which every line is ``{"s": SEQ, "m": MESSAGE, "t": H(key, SEQ MESSAGE)}`` with the session
key ``H(secret, Nc Nf NAME)`` and SEQ counting up from 0 in each direction, so a line cannot be
forged, altered, replayed or reordered. The link is authenticated, not encrypted: run commands and
log-free lifecycle messages cross it in clear, on the cluster's own network.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import socket
import threading

from .streams import accept_forever, close_socket

_AUTH_TIMEOUT_S = 10.0


class LinkError(Exception):
    pass


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


class PeerLink:
    """One authenticated link; received messages go to ``inbox`` as ("peer", self, dict | None)."""

    def __init__(self, sock: socket.socket, key: bytes, node: str, inbox: queue.Queue, rfile=None) -> None:  # noqa: ANN001
        self.sock = sock
        self.key = key
        self.node = node  # the follower's name (on both ends)
        self.inbox = inbox
        self._send_seq = 0
        self._recv_seq = 0
        self._lock = threading.Lock()
        self.closed = False
        self._file = rfile or sock.makefile("rb")  # the handshake's reader: it may hold buffered lines

    def start(self) -> None:
        threading.Thread(target=self._read, name="peer-%s" % self.node, daemon=True).start()

    def send(self, msg: dict) -> bool:
        with self._lock:
            if self.closed:
                return False
            body = json.dumps(msg, separators=(",", ":"), sort_keys=True)
            line = json.dumps(
                {"s": self._send_seq, "m": body, "t": _mac(self.key, str(self._send_seq), body)}
            )
            try:
                self.sock.sendall(line.encode() + b"\n")
            except OSError:
                self.closed = True
                return False
            self._send_seq += 1
            return True

    def _read(self) -> None:
        try:
            for raw in self._file:
                outer = json.loads(raw)
                body, seq = outer["m"], outer["s"]
                if seq != self._recv_seq or not hmac.compare_digest(
                    outer["t"], _mac(self.key, str(seq), body)
                ):
                    raise LinkError("a line failed its check")
                self._recv_seq += 1
                self.inbox.put(("peer", self, json.loads(body)))
        except (OSError, ValueError, KeyError, TypeError, LinkError):
            pass
        self.close()
        self.inbox.put(("peer", self, None))

    def close(self) -> None:
        self.closed = True
        close_socket(self.sock)


def _readline(f) -> dict:  # noqa: ANN001
    line = f.readline(4096)
    if not line:
        raise LinkError("closed during the handshake")
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise LinkError("bad handshake")
    return obj


class CoordServer:
    """Node 0's listener: each authenticated follower becomes a PeerLink (("peer_up", link, None))."""

    def __init__(self, secret: str, nodes: list, inbox: queue.Queue) -> None:
        self.secret = secret.encode()
        self.nodes = set(nodes)
        self.inbox = inbox
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, name="coord-accept", daemon=True).start()

    def _accept(self) -> None:
        accept_forever(
            self.sock, lambda c: threading.Thread(target=self._handshake, args=(c,), daemon=True).start()
        )

    def _handshake(self, conn: socket.socket) -> None:
        conn.settimeout(_AUTH_TIMEOUT_S)
        try:
            f = conn.makefile("rb")
            nonce_c = os.urandom(16).hex()
            conn.sendall(json.dumps({"nonce": nonce_c}).encode() + b"\n")
            hello = _readline(f)
            node, nonce_f, mac = str(hello["node"]), str(hello["nonce"]), str(hello["mac"])
            if node not in self.nodes or not hmac.compare_digest(mac, _mac(self.secret, "f", nonce_c, node)):
                raise LinkError("refused")
            conn.sendall(json.dumps({"mac": _mac(self.secret, "c", nonce_f, node)}).encode() + b"\n")
            conn.settimeout(None)
        except (OSError, ValueError, KeyError, TypeError, LinkError):
            conn.close()
            return
        key = hashlib.sha256(self.secret + ("\0%s\0%s\0%s" % (nonce_c, nonce_f, node)).encode()).digest()
        link = PeerLink(conn, key, node, self.inbox, f)
        self.inbox.put(("peer_up", link, None))
        link.start()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def dial(
    host: str, port: int, secret: str, node: str, inbox: queue.Queue, timeout_s: float = 10.0
) -> PeerLink:
    """Connect a follower to its coordinator; raises OSError or LinkError."""
    key_secret = secret.encode()
    conn = socket.create_connection((host, port), timeout=timeout_s)
    try:
        f = conn.makefile("rb")
        nonce_c = str(_readline(f)["nonce"])
        nonce_f = os.urandom(16).hex()
        mac = _mac(key_secret, "f", nonce_c, node)
        conn.sendall(json.dumps({"node": node, "nonce": nonce_f, "mac": mac}).encode() + b"\n")
        answer = _readline(f)
        if not hmac.compare_digest(str(answer.get("mac", "")), _mac(key_secret, "c", nonce_f, node)):
            raise LinkError("the coordinator did not prove it holds the run's secret")
        conn.settimeout(None)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    except (OSError, ValueError, KeyError, TypeError, LinkError):
        conn.close()
        raise
    key = hashlib.sha256(key_secret + ("\0%s\0%s\0%s" % (nonce_c, nonce_f, node)).encode()).digest()
    link = PeerLink(conn, key, node, inbox, f)
    link.start()
    return link
