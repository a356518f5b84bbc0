"""The preflight's TCP mesh test, node side: a listener that names its node to whoever connects,
and a prober that times a connect (one round trip) to each peer's listener. Stdlib only."""

from __future__ import annotations

import socket
import threading
import time


class MeshListener:
    """A TCP listener on an ephemeral port for the preflight mesh test: every connection gets one
    line (the console's token and this node's name) and is closed."""

    def __init__(self, greeting: str, timeout_s: float, avoid: tuple = ()) -> None:
        self.greeting = (greeting + "\n").encode("utf-8", "replace")
        self.deadline = time.monotonic() + timeout_s
        sock = _bind_ephemeral()
        if sock.getsockname()[1] in avoid:
            # The kernel picked the scheduler's port (it lies in the ephemeral range): holding it
            # would fail the port check and the job's scheduler. The next pick, with this one still
            # held, is another port.
            other = _bind_ephemeral()
            sock.close()
            sock = other
        sock.listen(128)
        sock.settimeout(0.2)
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._serve, name="mesh-listen", daemon=True).start()

    def _serve(self) -> None:
        while not self.closed and time.monotonic() < self.deadline:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            try:
                conn.settimeout(2.0)
                conn.sendall(self.greeting)
            except OSError:
                pass
            finally:
                conn.close()
        self.close()

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def _bind_ephemeral() -> socket.socket:
    try:  # one dual-stack socket where the node has IPv6: peers may be given either family
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0", 0))
    return sock


def probe_peer(peer: dict, token: str, timeout_s: float) -> dict:
    """Connect to one peer's mesh listener: the TCP connect time is one round trip."""
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
    try:
        sock.settimeout(timeout_s)
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
    words = got.decode("utf-8", "replace").strip().split(" ", 1)
    if len(words) == 2 and words[0] == token and words[1] == name:
        out["ok"] = True
    elif len(words) == 2 and words[0] == token:
        out["error"] = "reached %s instead" % words[1]
    else:
        out["error"] = "reached something other than an mscon agent"
    return out
