"""The preflight's TCP mesh test, node side: a listener on this node's own address, and a prober
that times a connect (one round trip) to each peer's listener. Stdlib only.

Both ends prove the run's mesh secret (the console hands it to every agent on its stdin, the
channel already trusted) without sending it: the caller sends a fresh nonce and an HMAC of it and
of the node it calls (so a call seen on the network is refused by every other listener), the
listener answers only a valid, unseen one, with its node's name and an HMAC of the nonce and that
name. A caller without the secret gets no byte and is closed within ``HANDSHAKE_S``. Callers are
read as they come (a caller's line is there when it is accepted), never after the whole backlog:
a flood of silent connections fills the cap (``agent/gate.py``'s rule) without shutting out a
caller whose line is there."""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import os
import selectors
import socket
import threading
import time

from ..gate import Pending

MAGIC = "mscon-mesh2"  # 2: the call's HMAC names the node called
HANDSHAKE_S = 2.0  # an unauthenticated caller is closed after this long at the latest
LINE_MAX = 256  # the caller's line: magic, a 32-hex nonce, a 64-hex HMAC
PENDING_MAX = 64  # connections still to prove the secret; past it one is closed (agent/gate.py)
_ACCEPT_BATCH = 16  # connections taken per wake-up before those waiting are read
_SEEN_MAX = 4096  # nonces remembered against replays (a mesh makes one per peer)
_BACKOFF_S = 0.1  # out of descriptors: accept again after this long
_NO_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_WILDCARDS = ("0.0.0.0", "::", "")


def mac(secret: str, label: str, nonce: str, name: str) -> str:
    """HMAC-SHA256 of one side's proof: ``label`` ("call" or "answer") keeps one from passing as
    the other; ``name`` is the listener's node (called, or answering)."""
    text = "\0".join((MAGIC, label, nonce, name)).encode("utf-8", "replace")
    return hmac.new(secret.encode("utf-8", "replace"), text, hashlib.sha256).hexdigest()


class MeshListener:
    """A TCP listener on an ephemeral port of this node's own address (``host`` as this node
    resolves it, else the address SSH reached it at or it routes to ``host`` from; never all
    addresses) for ``timeout_s``: a caller that proves ``secret`` gets one line, this node's
    ``name`` and the listener's proof, and is closed; any other is closed with nothing."""

    def __init__(self, name: str, secret: str, timeout_s: float, host: str = "", avoid: tuple = ()) -> None:
        self.name = name
        self.secret = secret
        self.deadline = time.monotonic() + timeout_s
        self.socks = _bind_own(host, avoid)
        for sock in self.socks:
            sock.listen(128)
            sock.setblocking(False)
        self.port = self.socks[0].getsockname()[1]
        self.address = self.socks[0].getsockname()[0]
        self.closed = False
        self._seen: set = set()
        self._gate = Pending()  # of the pending connections: which one a flood may push out
        threading.Thread(target=self._serve, name="mesh-listen", daemon=True).start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        pending: dict = {}  # socket -> [deadline, bytes so far]
        paused_until = 0.0
        try:
            for sock in self.socks:
                sel.register(sock, selectors.EVENT_READ, "listen")
            while not self.closed and time.monotonic() < self.deadline:
                now = time.monotonic()
                if paused_until and now >= paused_until:
                    paused_until = 0.0
                    for sock in self.socks:
                        sel.register(sock, selectors.EVENT_READ, "listen")
                for key, _ in sel.select(0.2):
                    if key.data == "listen":
                        if not self._accept(key.fileobj, sel, pending):
                            # Out of descriptors: let the pending ones time out, then try again
                            # (a level-triggered listener would spin meanwhile).
                            paused_until = time.monotonic() + _BACKOFF_S
                            for sock in self.socks:
                                sel.unregister(sock)
                            break
                    else:
                        self._read(key.fileobj, sel, pending)
                now = time.monotonic()
                for conn in [c for c, (due, _) in pending.items() if due <= now]:
                    self._drop(conn, sel, pending)
        except (OSError, ValueError):
            pass  # closed under it (close() from the agent's thread)
        finally:
            for conn in list(pending):
                self._drop(conn, sel, pending)
            sel.close()
            self.close()

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector, pending: dict) -> bool:
        """Take some of the connections waiting, each read at once (its line may be there
        already); False when out of descriptors."""
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _NO_FDS:
                    return False
                raise
            conn.setblocking(False)
            pending[conn] = [time.monotonic() + HANDSHAKE_S, b""]
            sel.register(conn, selectors.EVENT_READ, "conn")
            self._read(conn, sel, pending)  # answered and closed if its line is here
            if conn not in pending:
                continue
            # Over the cap, one that said nothing of a call goes, with nothing said (agent/gate.py).
            for victim in self._gate.add(conn, str(addr[0]), PENDING_MAX, valid=_calls(pending[conn][1])):
                self._drop(victim, sel, pending)
        return True

    def _read(self, conn: socket.socket, sel: selectors.BaseSelector, pending: dict) -> None:
        if conn not in pending:
            return  # pushed out by a flood in this same round
        try:
            chunk = conn.recv(LINE_MAX + 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        got = pending[conn][1] + chunk
        pending[conn][1] = got
        if chunk and b"\n" not in got and len(got) <= LINE_MAX:
            if _calls(got):
                self._gate.began(conn)
            return  # more to come, within the deadline
        nonce = self._proven(got.split(b"\n", 1)[0]) if b"\n" in got else None
        if nonce is not None:
            answer = "%s %s\n" % (self.name, mac(self.secret, "answer", nonce, self.name))
            try:
                conn.send(answer.encode("utf-8", "replace"))  # a few bytes into an empty buffer
            except OSError:
                pass
        self._drop(conn, sel, pending)

    def _drop(self, conn: socket.socket, sel: selectors.BaseSelector, pending: dict) -> None:
        self._gate.discard(conn)
        _drop(conn, sel, pending)

    def _proven(self, line: bytes) -> str | None:
        """The caller's nonce, if ``line`` proves the secret with one not seen before."""
        try:
            words = line.decode("ascii").split()
        except UnicodeDecodeError:
            return None
        if len(words) != 3 or words[0] != MAGIC or not 16 <= len(words[1]) <= 64:
            return None
        nonce, proof = words[1], words[2]
        if not hmac.compare_digest(proof, mac(self.secret, "call", nonce, self.name)) or nonce in self._seen:
            return None
        if len(self._seen) >= _SEEN_MAX:
            self._seen.clear()
        self._seen.add(nonce)
        return nonce

    def close(self) -> None:
        self.closed = True
        for sock in self.socks:
            try:
                sock.close()
            except OSError:
                pass


def _calls(got: bytes) -> bool:
    """The bytes so far begin a call (the magic word, then more)."""
    head = (MAGIC + " ").encode()
    return len(got) > 0 and (got.startswith(head) or head.startswith(got))


def _drop(conn: socket.socket, sel: selectors.BaseSelector, pending: dict) -> None:
    pending.pop(conn, None)
    try:
        sel.unregister(conn)
    except (KeyError, ValueError):
        pass
    conn.close()


def _bind_own(host: str, avoid: tuple) -> list:
    """Sockets bound to one ephemeral port on this node's own addresses for ``host`` (every local
    address it resolves to here), else on the address SSH reached this node at, else on the one it
    routes to ``host`` from. Never a wildcard address: OSError when none is known."""
    tried = []
    # Every local address ``host`` names here, or else the first fallback that is this node's.
    for addrs in [_local_candidates(host)] + [[a] for a in _fallback_candidates(host)]:
        addrs = [a for a in addrs if a[1] not in _WILDCARDS]
        tried += [a[1] for a in addrs]
        socks: list = []
        for family, addr in addrs:
            port = socks[0].getsockname()[1] if socks else 0
            try:
                sock = _bind_ephemeral(family, addr) if not socks else _bind(family, addr, port)
            except OSError:
                continue  # not an address of this node (EADDRNOTAVAIL), or that port is taken there
            if not socks and sock.getsockname()[1] in avoid:
                # The kernel picked the scheduler's port (it lies in the ephemeral range): holding
                # it would fail the port check and the job's scheduler. The next pick, with this
                # one still held, is another port.
                other = _bind_ephemeral(family, addr)
                sock.close()
                sock = other
            socks.append(sock)
        if socks:
            return socks + _ssh_address_too(host, socks)
    raise OSError(
        errno.EADDRNOTAVAIL,
        "no address of this node to listen on (tried %s)" % (", ".join(tried) or "none for %r" % host),
    )


def _ssh_address_too(host: str, socks: list) -> list:
    """For a host name this node resolves to loopback only (a Debian-style /etc/hosts maps its own
    name to 127.0.1.1) while its peers resolve it to its real address: the address SSH reached it
    at too, on the same port (best effort)."""
    if _is_ip(host) or not all(ipaddress.ip_address(s.getsockname()[0]).is_loopback for s in socks):
        return []
    bound = {s.getsockname()[0] for s in socks}
    for family, addr in _fallback_candidates(host)[:1]:
        if addr not in bound and addr not in _WILDCARDS:
            try:
                return [_bind(family, addr, socks[0].getsockname()[1])]
            except OSError:
                return []
    return []


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _local_candidates(host: str) -> list:
    if not host or host in _WILDCARDS:
        return []
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    out: list = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and (family, sockaddr[0]) not in out:
            out.append((family, str(sockaddr[0])))
    return out


def _fallback_candidates(host: str) -> list:
    out: list = []
    parts = os.environ.get("SSH_CONNECTION", "").split()
    if len(parts) == 4:  # "client port server port": the server side is this node's address
        out.append((socket.AF_INET6 if ":" in parts[2] else socket.AF_INET, parts[2]))
    for family, addr in _local_candidates(host):
        try:  # no packet leaves: a UDP connect only picks the route and its source address
            probe = socket.socket(family, socket.SOCK_DGRAM)
            try:
                probe.connect((addr, 9))
                out.append((family, str(probe.getsockname()[0])))
            finally:
                probe.close()
        except OSError:
            continue
    return out


def _bind(family: int, addr: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((addr, port))
    except OSError:
        sock.close()
        raise
    return sock


def _bind_ephemeral(family: int, addr: str) -> socket.socket:
    return _bind(family, addr, 0)


def probe_peer(peer: dict, secret: str, timeout_s: float) -> dict:
    """Connect to one peer's mesh listener (the TCP connect time is one round trip), prove the
    run's secret and check the peer's proof: only then is it the node it should be."""
    name, host, port = str(peer.get("name", "")), str(peer.get("host", "")), int(peer.get("port", 0))
    out = {"name": name, "host": host, "port": port, "ok": False, "rtt_ms": None, "error": ""}
    t0 = time.perf_counter()
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except socket.timeout:
        out["error"] = "timed out after %gs" % timeout_s
        return out
    except OSError as exc:
        out["error"] = exc.strerror or str(exc)
        return out
    out["rtt_ms"] = (time.perf_counter() - t0) * 1000
    nonce = os.urandom(16).hex()
    try:
        sock.settimeout(timeout_s)
        call = "%s %s %s\n" % (MAGIC, nonce, mac(secret, "call", nonce, name))
        sock.sendall(call.encode("ascii", "replace"))
        got = b""
        while not got.endswith(b"\n") and len(got) < 1024:
            chunk = sock.recv(1024)
            if not chunk:
                break
            got += chunk
    except OSError as exc:
        out["error"] = "connected, then %s" % (exc.strerror or exc)
        return out
    finally:
        sock.close()
    words = got.decode("utf-8", "replace").strip().rsplit(" ", 1)
    proof = words[-1].encode("utf-8", "replace")  # bytes: compare_digest refuses non-ASCII text
    if len(words) == 2 and hmac.compare_digest(proof, mac(secret, "answer", nonce, words[0]).encode()):
        if words[0] == name:
            out["ok"] = True
        else:
            out["error"] = "reached %s instead" % words[0]
    else:
        out["error"] = "reached something other than this run's mscon agent"
    return out
