"""The preflight's mesh listener: bound to the node's own address, answering only callers that
prove the mesh's secret (and proving it back), never sending the secret; anyone else gets no byte
and is closed within the handshake deadline."""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Iterator

import pytest
from mscon.agent.checks import mesh

SECRET = "5e" * 16


@pytest.fixture
def listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[mesh.MeshListener]:
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    got = mesh.MeshListener("node1", SECRET, 30.0, "127.0.0.1")
    yield got
    got.close()


def _answer(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the listener sends until it closes, and how long that took."""
    t0 = time.monotonic()
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass  # closed with our bytes unread: a reset, as good as a close
    return got, time.monotonic() - t0


def _call_line(secret: str) -> bytes:
    nonce = os.urandom(16).hex()
    return f"{mesh.MAGIC} {nonce} {mesh.mac(secret, 'call', nonce, 'node1')}\n".encode()


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # says nothing
        b"hello\n",
        b"x" * (mesh.LINE_MAX + 10),  # an over-long line, no newline
        _call_line("not the secret"),
        f"{mesh.MAGIC} {'ab' * 16} {'0' * 64}\n".encode(),
        f"{mesh.MAGIC} {'ab' * 16} ".encode() + "\u00e9".encode() * 32 + b"\n",
        b"\xff\xfe" * 20 + b"\n",
    ],
    ids=["silent", "garbage", "overlong", "wrong-secret", "forged-proof", "non-ascii-proof", "not-text"],
)
def test_a_caller_without_the_secret_gets_nothing_and_is_closed(
    listener: mesh.MeshListener, sent: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
        if sent:
            sock.sendall(sent)
        got, took = _answer(sock, mesh.HANDSHAKE_S + 10)
    assert got == b""
    assert took < mesh.HANDSHAKE_S + 5, f"held open {took:.1f} s"
    peer = {"name": "node1", "host": "127.0.0.1", "port": listener.port}
    assert mesh.probe_peer(peer, SECRET, 5.0)["ok"]  # and it serves on


def test_a_caller_with_the_secret_is_answered_with_a_proof_not_the_secret(
    listener: mesh.MeshListener,
) -> None:
    nonce = os.urandom(16).hex()
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
        sock.sendall(f"{mesh.MAGIC} {nonce} {mesh.mac(SECRET, 'call', nonce, 'node1')}\n".encode())
        got, _ = _answer(sock, 10)
    name, proof = got.decode().split()
    assert name == "node1" and proof == mesh.mac(SECRET, "answer", nonce, "node1")
    assert SECRET.encode() not in got
    found = mesh.probe_peer({"name": "node1", "host": "127.0.0.1", "port": listener.port}, SECRET, 5.0)
    assert found["ok"] and found["error"] == "" and 0 < found["rtt_ms"] < 5000, found


def test_a_replayed_call_is_not_answered(listener: mesh.MeshListener) -> None:
    line = _call_line(SECRET)
    answers = []
    for _ in range(2):
        with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
            sock.sendall(line)
            answers.append(_answer(sock, 10)[0])
    assert answers[0].startswith(b"node1 ") and answers[1] == b""


def test_the_prober_checks_the_listeners_proof_and_name(listener: mesh.MeshListener) -> None:
    peer = {"name": "node1", "host": "127.0.0.1", "port": listener.port}
    wrong_secret = mesh.probe_peer(peer, "another run's secret", 5.0)
    assert not wrong_secret["ok"] and "other than this run's mscon agent" in wrong_secret["error"]
    # A call for node2 is node2's alone (its HMAC names it): node1 says nothing to it.
    other_name = mesh.probe_peer(dict(peer, name="node2"), SECRET, 5.0)
    assert not other_name["ok"] and "other than this run's mscon agent" in other_name["error"]


def test_it_binds_the_nodes_own_address_never_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    own = mesh.MeshListener("node1", SECRET, 30.0, "127.0.0.3")
    try:
        assert all(s.getsockname()[0] == "127.0.0.3" for s in own.socks)
        assert own.address == "127.0.0.3"
        with pytest.raises(ConnectionRefusedError):  # another address of the node: nothing there
            socket.create_connection(("127.0.0.2", own.port), timeout=5).close()
        assert mesh.probe_peer({"name": "node1", "host": "127.0.0.3", "port": own.port}, SECRET, 5.0)["ok"]
    finally:
        own.close()


def test_an_address_not_the_nodes_falls_back_to_where_ssh_reached_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The console's address for a node may not be one of its own (NAT, a name that resolves
    elsewhere): the address SSH reached it at is, and still not all addresses."""
    monkeypatch.setenv("SSH_CONNECTION", "10.9.9.9 50000 127.0.0.5 22")
    own = mesh.MeshListener("node1", SECRET, 30.0, "192.0.2.1")  # TEST-NET-1: nobody's here
    try:
        assert [s.getsockname()[0] for s in own.socks] == ["127.0.0.5"]
    finally:
        own.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_a_wildcard_or_no_address_is_never_bound(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    with pytest.raises(OSError, match="no address of this node"):
        mesh.MeshListener("node1", SECRET, 30.0, host).close()


def test_a_flood_of_silent_connections_does_not_shut_out_a_real_caller(
    listener: mesh.MeshListener,
) -> None:
    flood = [
        socket.create_connection(("127.0.0.1", listener.port), timeout=5) for _ in range(3 * mesh.PENDING_MAX)
    ]
    try:
        peer = {"name": "node1", "host": "127.0.0.1", "port": listener.port}
        found = mesh.probe_peer(peer, SECRET, 5.0)
        assert found["ok"], found
        for sock in flood:  # none of them was told anything
            assert _answer(sock, mesh.HANDSHAKE_S + 10)[0] == b""
    finally:
        for sock in flood:
            sock.close()


class _OutOfDescriptors:
    """A listening socket whose first ``fails`` accepts fail as a process out of descriptors sees."""

    def __init__(self, sock: socket.socket, fails: int) -> None:
        self.sock, self.fails, self.calls = sock, fails, 0

    def accept(self) -> tuple[socket.socket, object]:
        self.calls += 1
        if self.fails:
            self.fails -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return self.sock.accept()

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_out_of_descriptors_it_backs_off_and_serves_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    real = mesh._bind_own
    wrapped: list[_OutOfDescriptors] = []

    def bind(host: str, avoid: tuple) -> list:
        wrapped.extend(_OutOfDescriptors(s, 3) for s in real(host, avoid))
        return list(wrapped)

    monkeypatch.setattr(mesh, "_bind_own", bind)
    own = mesh.MeshListener("node1", SECRET, 30.0, "127.0.0.1")
    try:
        found = mesh.probe_peer({"name": "node1", "host": "127.0.0.1", "port": own.port}, SECRET, 10.0)
        assert found["ok"], found
        assert wrapped[0].fails == 0 and wrapped[0].calls >= 4  # it failed three times, then served
    finally:
        own.close()


def test_a_name_that_resolves_to_loopback_here_also_listens_where_ssh_reached_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node whose /etc/hosts maps its own name to loopback (Debian's 127.0.1.1) while its peers
    resolve the name to its real address: it listens on both, and still not on all addresses."""
    monkeypatch.setenv("SSH_CONNECTION", "10.9.9.9 50000 127.0.0.5 22")
    own = mesh.MeshListener("node1", SECRET, 30.0, "localhost")
    try:
        bound = {s.getsockname()[0] for s in own.socks}
        assert "127.0.0.5" in bound and ("127.0.0.1" in bound or "::1" in bound), bound
        assert not bound & {"0.0.0.0", "::"}
        assert mesh.probe_peer({"name": "node1", "host": "127.0.0.5", "port": own.port}, SECRET, 5.0)["ok"]
    finally:
        own.close()
    literal = mesh.MeshListener("node1", SECRET, 30.0, "127.0.0.1")  # an address: that one only
    try:
        assert [s.getsockname()[0] for s in literal.socks] == ["127.0.0.1"]
    finally:
        literal.close()
