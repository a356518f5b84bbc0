"""The preflight's mesh listener (agent/checks/mesh.py) under a flood and a replay (issue 45, lows):
a caller queued behind a full backlog of silent connections is read and answered, not closed
unread; and a call seen at one listener is refused at every other one (its HMAC names the node
called)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from mscon.agent.checks import mesh

SECRET = "5e" * 16


def _captured_call(name: str) -> bytes:
    """The line ``probe_peer`` sends to call ``name`` (what a party on the network could copy)."""
    server = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def capture() -> None:
        conn, _ = server.accept()
        with conn:
            line = b""
            while not line.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                line += chunk
            got.append(line)

    t = threading.Thread(target=capture, daemon=True)
    t.start()
    mesh.probe_peer({"name": name, "host": "127.0.0.1", "port": server.getsockname()[1]}, SECRET, 5.0)
    t.join(10)
    server.close()
    assert got and got[0].endswith(b"\n"), got
    return got[0]


def _answer(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    yield


def test_a_call_seen_at_one_listener_is_refused_at_another(no_ssh: None) -> None:
    node1 = mesh.MeshListener("node1", SECRET, 30.0, "127.0.0.1")
    node2 = mesh.MeshListener("node2", SECRET, 30.0, "127.0.0.1")
    try:
        line = _captured_call("node1")
        with socket.create_connection(("127.0.0.1", node2.port), timeout=5) as sock:
            sock.sendall(line)  # the replay, at a listener that has not seen its nonce
            assert _answer(sock) == b""
        with socket.create_connection(("127.0.0.1", node1.port), timeout=5) as sock:
            sock.sendall(line)  # where it was meant for: answered
            assert _answer(sock).startswith(b"node1 ")
    finally:
        node1.close()
        node2.close()


def test_a_caller_behind_a_backlog_of_silent_connections_is_answered(
    no_ssh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener's loop held while 20 silent connections, a caller (its line sent), then 100
    more silent ones queue up: once it runs, the caller is read as it is taken and answered.
    Before: the whole backlog was taken first and the cap of 64 closed the caller unread."""
    go = threading.Event()
    serve = mesh.MeshListener._serve

    def held(self: mesh.MeshListener) -> None:
        go.wait(30)
        serve(self)

    monkeypatch.setattr(mesh.MeshListener, "_serve", held)
    listener = mesh.MeshListener("node1", SECRET, 30.0, "127.0.0.1")
    line = _captured_call("node1")
    silent: list[socket.socket] = []
    try:
        silent += [socket.create_connection(("127.0.0.1", listener.port), timeout=5) for _ in range(20)]
        caller = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
        caller.sendall(line)
        silent += [socket.create_connection(("127.0.0.1", listener.port), timeout=5) for _ in range(100)]
        go.set()
        assert _answer(caller).startswith(b"node1 ")
        caller.close()
    finally:
        go.set()
        for sock in silent:
            sock.close()
        listener.close()
