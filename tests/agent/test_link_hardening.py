"""The coordinator link under attack, with real sockets: the address it binds, the handshake's one
deadline (TLS's and the secret's), the cap on handshakes in progress, running out of file
descriptors, lines reflected, replayed, garbled or too long inside TLS (by a party that holds the
run's certificate but not its secret); and a detached run of two real agents that 1,025
connections which never authenticate leave untouched."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from detached_agents import RUN_TLS, DetachedAgent
from mscon.agent import protocol as P
from mscon.agent import tls
from mscon.agent.detached import coord

SECRET = "s3cret"
MATERIAL = {"cert": RUN_TLS.cert, "key": RUN_TLS.key}


@pytest.fixture
def server() -> Iterator[tuple[coord.CoordServer, queue.Queue]]:
    inbox: queue.Queue = queue.Queue()
    srv = coord.CoordServer(SECRET, ["node2", "node3"], inbox, host="127.0.0.1", **MATERIAL)
    yield srv, inbox
    srv.close()


def _dial(port: int, node: str, inbox: queue.Queue, **kw: object) -> coord.PeerLink:
    return coord.dial("127.0.0.1", port, SECRET, node, inbox, **MATERIAL, **kw)


def _next(inbox: queue.Queue, kind: str, timeout: float = 5.0) -> tuple:
    deadline = time.monotonic() + timeout
    while True:
        item = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        if item[0] == kind:
            return item


def _raw(port: int, host: str = "127.0.0.1", source: str = "") -> socket.socket:
    """A TCP connection; from ``source`` when given (another 127/8 address: another host, as the
    coordinator counts them)."""
    sock = socket.create_connection((host, port), timeout=5, source_address=(source, 0) if source else None)
    sock.settimeout(5)
    return sock


def _connect(port: int, host: str = "127.0.0.1", source: str = "") -> ssl.SSLSocket:
    """A TLS connection with the run's certificate (a party that holds it, not the secret)."""
    sock = tls.client_context(RUN_TLS.cert, RUN_TLS.key).wrap_socket(_raw(port, host, source))
    tls.check_peer(sock, RUN_TLS.cert)
    return sock


def _read_obj(sock: socket.socket) -> dict:
    """One handshake line from the coordinator (it speaks first, to anyone: its nonce)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(4096)
        assert chunk, "closed during the handshake"
        line += chunk
    return json.loads(line)


def _closed_by_peer(sock: socket.socket, wait_s: float = 0.0) -> bool:
    """The other end closed: end of file (or a reset) is readable within ``wait_s``, after
    whatever it sent before."""
    poll = select.poll()  # not select(): the flood's descriptors go past 1,024
    poll.register(sock, select.POLLIN)
    while poll.poll(wait_s * 1000):
        try:
            if sock.recv(65536) == b"":
                return True
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            return True
        except ssl.SSLWantReadError:  # TLS bytes that were no data (a ticket): look again
            continue
    return False


def test_the_coordinator_listens_on_the_address_it_is_given_only() -> None:
    inbox: queue.Queue = queue.Queue()
    bound = coord.CoordServer(SECRET, ["node2"], inbox, host="127.0.0.1", **MATERIAL)
    try:
        assert bound.sock.getsockname()[0] == "127.0.0.1"
        with pytest.raises(ConnectionRefusedError):  # 127.0.0.2 is this machine too, another address
            socket.create_connection(("127.0.0.2", bound.port), timeout=5)
        with pytest.raises(coord.LinkError):  # no address given: an error, never every interface
            coord.CoordServer(SECRET, ["node2"], inbox, **MATERIAL)
        link = _dial(bound.port, "node2", queue.Queue())
        assert _next(inbox, "peer_up")[1].node == "node2"
        link.close()
    finally:
        bound.close()


def test_a_dripped_tls_handshake_has_the_same_one_deadline(
    server: tuple[coord.CoordServer, queue.Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TLS record header that announces 16 KiB, then a byte every 0.2 s: cut at the deadline."""
    monkeypatch.setattr(coord, "HANDSHAKE_S", 1.0)
    srv, inbox = server
    sock = _raw(srv.port)
    t0 = time.monotonic()
    sock.sendall(b"\x16\x03\x01\x40\x00")
    for _ in range(100):
        with contextlib.suppress(OSError):
            sock.sendall(b"\0")
        if _closed_by_peer(sock, 0.2):
            break
    took = time.monotonic() - t0
    assert 0.9 <= took < 2.0, f"the dripping TLS handshake was held {took:.1f}s"
    sock.close()
    assert inbox.empty()


def test_a_handshake_has_one_deadline_however_slowly_the_peer_drips(
    server: tuple[coord.CoordServer, queue.Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coord, "HANDSHAKE_S", 1.0)
    srv, inbox = server
    sock = _connect(srv.port)
    t0 = time.monotonic()
    _read_obj(sock)
    # One byte of a plausible hello every 0.2 s: each read gets data well within any per-read timeout.
    hello = b'{"node": "node2", "nonce": "' + b"0" * 200
    closed = False
    for byte in hello:
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        if closed or _closed_by_peer(sock, 0.2):
            break
    took = time.monotonic() - t0
    assert took < 2.0, f"the dripping connection was held {took:.1f}s"
    assert took >= 0.9
    sock.close()
    assert inbox.empty()


def test_handshakes_in_progress_are_capped_the_oldest_closed_first(
    server: tuple[coord.CoordServer, queue.Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coord, "PENDING_MAX", 4)
    srv, inbox = server
    threads = threading.active_count()
    silent = [_raw(srv.port) for _ in range(10)]  # taken in this order; never a TLS byte
    wait_for(lambda: len(srv._pending) == 4, 5, "four handshakes in progress")
    assert threading.active_count() == threads, "a thread per connection that has not authenticated"
    wait_for(lambda: all(_closed_by_peer(s) for s in silent[:6]), 5, "the six oldest closed")
    assert not any(_closed_by_peer(s) for s in silent[6:]), "the four newest wait for their deadline"
    # A follower gets in all the same (it pushes the oldest silent one out).
    link = _dial(srv.port, "node2", queue.Queue())
    _, up, _ = _next(inbox, "peer_up")
    assert link.send({"type": "ping"})
    assert _next(inbox, "peer")[2] == {"type": "ping"}
    assert up.send({"type": "stop"})
    link.close()
    for sock in silent:
        sock.close()


@pytest.mark.parametrize(
    "flood_from", ["127.0.0.2", "127.0.0.1"], ids=["another-address", "the-followers-address"]
)
def test_a_flood_pushes_out_its_own_connections_never_a_follower_past_tls(
    server: tuple[coord.CoordServer, queue.Queue], monkeypatch: pytest.MonkeyPatch, flood_from: str
) -> None:
    """Even from the follower's own address (another user on its node): a connection that showed
    the run's certificate is never pushed out, however old."""
    monkeypatch.setattr(coord, "PENDING_MAX", 4)
    srv, inbox = server
    follower = _connect(srv.port)  # a slow follower: the oldest handshake of all
    nonce = _read_obj(follower)["nonce"]
    flood = [_raw(srv.port, source=flood_from) for _ in range(20)]  # no certificate: never past TLS
    wait_for(lambda: all(_closed_by_peer(s) for s in flood[:17]), 5, "the flood's oldest closed")
    assert not _closed_by_peer(follower)
    mac = coord._mac(SECRET.encode(), "f", nonce, "node2")
    follower.sendall(json.dumps({"node": "node2", "nonce": "00", "mac": mac}).encode() + b"\n")
    assert "mac" in _read_obj(follower)  # the coordinator's proof: the follower is in
    assert _next(inbox, "peer_up")[1].node == "node2"
    for sock in [follower, *flood]:
        sock.close()


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"not json\n", id="not-json"),
        pytest.param(b"[1, 2]\n", id="a-list"),
        pytest.param(b"[" * 3000 + b"\n", id="deep"),  # nesting past the recursion limit
        pytest.param(b'{"node": "node2", "nonce": "n", "mac": "\\u00e9"}\n', id="non-ascii-mac"),
        pytest.param(b'{"node": ["node2"], "nonce": 1, "mac": null}\n', id="wrong-types"),
        pytest.param(b'{"node": "node2"}\n', id="missing-fields"),
        pytest.param(b"x" * 5000, id="over-the-bound"),  # never ended by a newline
    ],
)
@pytest.mark.parametrize("inside_tls", [False, True], ids=["instead-of-tls", "inside-tls"])
def test_garbage_before_the_handshake_is_closed_at_once(
    server: tuple[coord.CoordServer, queue.Queue], garbage: bytes, inside_tls: bool
) -> None:
    srv, inbox = server
    sock: socket.socket = _connect(srv.port) if inside_tls else _raw(srv.port)
    if inside_tls:
        _read_obj(sock)
    t0 = time.monotonic()
    sock.sendall(garbage)
    assert _closed_by_peer(sock, 5.0)
    assert time.monotonic() - t0 < 2.0, "closed at once, not at the handshake's deadline"
    sock.close()
    link = _dial(srv.port, "node3", queue.Queue())
    assert _next(inbox, "peer_up")[1].node == "node3"
    link.close()


# ------------------------------------------------------------------ a man in the middle


class Middle:
    """A man in the middle between one follower and the coordinator that holds the run's
    certificate (not its secret): ends TLS on both sides, passes the lines both ways, keeps those
    of each direction, and injects bytes either way, inside TLS."""

    def __init__(self, coordinator_port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target = coordinator_port
        self.lines: dict[str, list[bytes]] = {"up": [], "down": []}  # up: follower -> coordinator
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        raw, _ = self.listener.accept()
        conn = tls.server_context(RUN_TLS.cert, RUN_TLS.key).wrap_socket(raw, server_side=True)
        self.follower = tls.TlsSock(conn)
        self.coordinator = tls.TlsSock(tls.connect("127.0.0.1", self.target, RUN_TLS.cert, RUN_TLS.key, 5))
        threading.Thread(target=self._pump, args=(self.follower, self.coordinator, "up"), daemon=True).start()
        self._pump(self.coordinator, self.follower, "down")

    def _pump(self, src: tls.TlsSock, dst: tls.TlsSock, way: str) -> None:
        pending = b""
        while True:
            try:
                chunk = src.recv(65536)
                if not chunk:
                    break
                dst.sendall(chunk)
            except OSError:
                break
            pending += chunk
            *done, pending = pending.split(b"\n")
            self.lines[way] += [line + b"\n" for line in done]
        for s in (src, dst):
            s.close()

    def to_follower(self, data: bytes) -> None:
        self.follower.sendall(data)

    def to_coordinator(self, data: bytes) -> None:
        self.coordinator.sendall(data)

    def close(self) -> None:
        self.listener.close()
        for s in (getattr(self, "follower", None), getattr(self, "coordinator", None)):
            if s is not None:
                s.close()


@pytest.fixture
def middle(server: tuple[coord.CoordServer, queue.Queue]) -> Iterator[tuple]:
    """(middle, the coordinator's inbox, its end of the link, the follower's inbox, its end)."""
    srv, inbox = server
    mitm = Middle(srv.port)
    f_inbox: queue.Queue = queue.Queue()
    link = _dial(mitm.port, "node2", f_inbox)
    _, up, _ = _next(inbox, "peer_up")
    yield mitm, inbox, up, f_inbox, link
    link.close()
    mitm.close()


def _from(inbox: queue.Queue, link: coord.PeerLink, timeout: float = 5.0) -> dict | None:
    """The next message (None: the end) of one link, skipping the others'."""
    deadline = time.monotonic() + timeout
    while True:
        kind, source, msg = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        if kind == "peer" and source is link:
            return msg


def _signed_lines(mitm: Middle, way: str, count: int) -> list[bytes]:
    """The signed lines seen going ``way``, once ``count`` are there (the handshake's are skipped)."""
    wait_for(lambda: len([x for x in mitm.lines[way] if b'"s"' in x]) >= count, 5, f"{count} {way} lines")
    return [x for x in mitm.lines[way] if b'"s"' in x]


def test_a_line_reflected_to_the_follower_is_refused(middle: tuple) -> None:
    mitm, inbox, up, f_inbox, link = middle
    assert link.send({"type": "status", "ok": [], "all_exited": False})
    assert _next(inbox, "peer")[2]["type"] == "status"
    # The follower's first line (sequence 0) is exactly what the follower expects next from the
    # coordinator, but for its direction: sent back to it, it must not pass.
    (line,) = _signed_lines(mitm, "up", 1)
    mitm.to_follower(line)
    assert _next(f_inbox, "peer")[2] is None, "the reflected line was taken as the coordinator's"


def test_a_line_reflected_to_the_coordinator_is_refused(middle: tuple) -> None:
    mitm, inbox, up, f_inbox, link = middle
    assert up.send({"type": "ping"})
    assert _next(f_inbox, "peer")[2] == {"type": "ping"}
    (line,) = _signed_lines(mitm, "down", 1)
    mitm.to_coordinator(line)
    assert _next(inbox, "peer")[2] is None, "the reflected line was taken as the follower's"


def test_a_replayed_line_is_refused_and_the_link_ends(middle: tuple) -> None:
    mitm, inbox, up, f_inbox, link = middle
    assert link.send({"type": "proc_exited", "name": "r1", "exitcode": 1})
    assert _next(inbox, "peer")[2]["type"] == "proc_exited"
    (line,) = _signed_lines(mitm, "up", 1)
    mitm.to_coordinator(line)  # the same line again: its sequence number is spent
    assert _next(inbox, "peer")[2] is None


@pytest.mark.parametrize("way", ["to_coordinator", "to_follower"])
@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"garbage\n", id="not-json"),
        pytest.param(b"[1]\n", id="a-list"),
        pytest.param(b"[" * 5000 + b"\n", id="deep"),
        pytest.param(b'{"s": 0, "m": "{}", "t": "\\u00e9"}\n', id="non-ascii-tag"),
        pytest.param(b'{"s": "0", "m": 1, "t": 2}\n', id="wrong-types"),
        pytest.param(b"oversized", id="over-the-bound"),  # a line over LINE_MAX, no newline
    ],
)
def test_garbage_or_an_oversized_line_ends_that_link_only(
    middle: tuple, server: tuple[coord.CoordServer, queue.Queue], way: str, garbage: bytes
) -> None:
    if garbage == b"oversized":
        garbage = b"y" * (coord.LINE_MAX + 65536)
    mitm, inbox, up, f_inbox, link = middle
    srv, _ = server
    other_inbox: queue.Queue = queue.Queue()
    other = _dial(srv.port, "node3", other_inbox)
    _, other_up, _ = _next(inbox, "peer_up")
    with contextlib.suppress(OSError):  # the end that refuses may close before all is sent
        getattr(mitm, way)(garbage)
    if way == "to_coordinator":
        assert _from(inbox, up) is None
    else:
        assert _from(f_inbox, link) is None
    # The run's other link goes on, both ways.
    assert other.send({"type": "ping"})
    assert _from(inbox, other_up) == {"type": "ping"}
    assert other_up.send({"type": "stop"})
    assert _from(other_inbox, other) == {"type": "stop"}
    other.close()


# ------------------------------------------------------------------ out of file descriptors

_CHILD = """
import queue, resource, sys, threading
from mscon.agent.detached import coord
coord.HANDSHAKE_S = 2.0
inbox = queue.Queue()
cert, key = sys.stdin.read().split("\\0")
server = coord.CoordServer("s3cret", ["node2"], inbox, host="127.0.0.1", cert=cert, key=key)
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print(server.port, flush=True)
while True:
    kind, link, msg = inbox.get()
    if kind == "peer" and msg is not None:
        link.send({"echo": msg, "threads": threading.active_count()})
"""


def test_out_of_descriptors_the_coordinator_backs_off_and_a_follower_still_gets_in() -> None:
    """A coordinator whose process may hold 32 descriptors, 60 connections that never authenticate:
    accepting fails with EMFILE, the listener waits and accepts again as the handshakes' deadline
    frees descriptors, and a follower that dials meanwhile gets in."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    silent: list[socket.socket] = []
    try:
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        child.stdin.write(f"{RUN_TLS.cert}\0{RUN_TLS.key}".encode())
        child.stdin.close()
        port = int(child.stdout.readline())
        for i in range(60):  # all accepted by the kernel: they wait in the listen queue
            silent.append(_raw(port, source=f"127.0.0.{2 + i % 8}"))  # below gate.PER_HOST_MAX each
        inbox: queue.Queue = queue.Queue()
        link = _dial(port, "node2", inbox, timeout_s=15)
        assert link.send({"type": "ping"})
        _, _, answer = _next(inbox, "peer", 5)
        assert answer["echo"] == {"type": "ping"}
        assert answer["threads"] <= 3, "main, the port's loop, the link's reader"
        link.close()
        assert child.poll() is None
    finally:
        for sock in silent:
            sock.close()
        child.kill()
    err = child.stderr.read().decode()
    assert "out of file descriptors" in err
    assert "accepting again" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------ a detached run under attack


def _raise_own_nofile(at_least: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < at_least:
        if hard != resource.RLIM_INFINITY and hard < at_least:
            pytest.skip(f"needs {at_least} descriptors in the test process (hard limit {hard})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (at_least, hard))
    return soft, hard


def test_a_detached_run_is_untouched_by_1025_connections_that_never_authenticate(tmp_path: Path) -> None:
    """Node 0's agent at a soft nofile of 1,024, 1,025 connections to its coordinator port, each
    dripping a byte a second: the follower still dials in, both ranks run on, the agent holds no
    more threads than before nor more descriptors than the cap, and the link carries the policy."""
    old = _raise_own_nofile(1025 + 512)
    n0 = DetachedAgent("n0", nofile=1024, handshake_s=3.0)
    n1 = DetachedAgent("n1")
    silent: list[socket.socket] = []
    refused: list[OSError] = []
    stop = threading.Event()

    def attack(port: int) -> None:
        try:
            for _ in range(1025):  # from another address than the follower's, as from another host
                silent.append(_raw(port, source="127.0.0.2"))
        except OSError as exc:
            refused.append(exc)
        while not stop.wait(1.0):  # the attack's pace, not a synchronisation
            for sock in silent:
                with contextlib.suppress(OSError):
                    sock.send(b"{")

    try:
        r0 = n0.start(tmp_path / "n0", 0)
        n1.start(tmp_path / "n1", 1)
        port = n0.detach(role=P.Role.COORDINATOR, nodes=("n0", "n1")).coordinator_port
        assert port
        threads, fds = n0.threads(), n0.ps.num_fds()
        threading.Thread(target=attack, args=(port,), daemon=True).start()
        wait_for(lambda: len(silent) >= 100 or refused, 10, "the flood under way")
        # The follower detaches (dials in) while the flood goes on.
        joined = n1.detach(role=P.Role.FOLLOWER, coordinator_host="127.0.0.1", coordinator_port=port)
        assert joined.error == ""
        lines_before = sum(len(m.lines) for m in n0.seen if isinstance(m, P.LogBatch))
        peak_threads, peak_fds = 0, 0
        t_end = time.monotonic() + 6.0  # past the 5 s watchdog: a starved link would be declared lost
        while time.monotonic() < t_end or (len(silent) < 1025 and not refused):
            peak_threads = max(peak_threads, n0.threads())
            peak_fds = max(peak_fds, n0.ps.num_fds())
            assert time.monotonic() < t_end + 15, f"the flood opened only {len(silent)} connections"
            time.sleep(0.1)  # the sampling pace
        assert not refused, "the coordinator port refused a connection"
        n0.drain()
        n1.drain()
        assert peak_threads <= threads + 1, f"{threads} threads before the flood, {peak_threads} during it"
        assert peak_fds <= fds + coord.PENDING_MAX + 4, f"{fds} descriptors before, {peak_fds} during"
        lines_during = sum(len(m.lines) for m in n0.seen if isinstance(m, P.LogBatch)) - lines_before
        assert lines_during >= 30, f"r0 printed {lines_during} lines in 6 s at 20 a second"
        assert not [m for m in n0.seen + n1.seen if isinstance(m, (P.Coord, P.ProcExited, P.AgentError))]
        wait_for(lambda: all(_closed_by_peer(s) for s in silent), 10, "every silent connection closed")
        # The link carries the policy both ways: r0 fails, the coordinator stops r1 on n1, n1
        # reports its end back, and the coordinator closes the attempt.
        os.kill(r0.pid, signal.SIGKILL)
        stopped = n1.until(lambda m: isinstance(m, P.ProcExited) and m.name == "r1")
        assert isinstance(stopped, P.ProcExited) and stopped.stopped_by_agent
        n0.until(lambda m: isinstance(m, P.Coord) and m.kind == P.CoordKind.ATTEMPT_ENDED)
    finally:
        stop.set()
        for sock in silent:
            sock.close()
        n0.kill()
        n1.kill()
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
    assert b"Traceback" not in n0.stderr
    assert b"out of file descriptors" not in n0.stderr
