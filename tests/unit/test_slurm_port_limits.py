"""The console's Slurm port keeps the limits of every mscon listener (agent/gate.py): one deadline
for TLS's handshake and the key's proof together, at most PENDING_MAX connections in progress
(the busiest address's oldest pushed out), junk closed at once, and running out of descriptors
survived; a node with the run's certificate and key gets in all the while."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mscon.agent import dial, gate, tls
from mscon.console.config.inventory import load_inventory
from mscon.console.transport import slurm_dial as sd
from mscon.console.transport import slurm_launcher as sl
from mscon.console.transport.link_tls import RunTls

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def launcher(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[sl.SlurmLauncher]:
    monkeypatch.setenv(sl.ENV_CONSOLE_ADDRESS, "127.0.0.1")
    la = sl.SlurmLauncher(load_inventory(REPO / "inventory" / "local.yaml"))
    await la._listen()
    yield la
    await la.close()


def _node(la: sl.SlurmLauncher) -> bytes:
    """A node's boot connection: TLS, the key's proof; the console's first line (the source's size)."""
    s = tls.TlsSock(tls.connect("127.0.0.1", la.port, la.tls.cert, la.tls.key, 10))
    try:
        f = dial.Lines(s)
        dial.dial_handshake(s, f, la.keys.new_step(frozenset({"n1"}))[1], "boot")
        return f.readline()
    finally:
        s.close()


def _closed(sock: socket.socket, wait_s: float = 0.0) -> bool:
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    while poll.poll(wait_s * 1000):
        try:
            if sock.recv(65536) == b"":
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


async def test_pending_connections_are_capped_and_a_node_still_gets_in(
    launcher: sl.SlurmLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate, "PENDING_MAX", 8)
    port = launcher.port
    silent = [socket.create_connection(("127.0.0.1", port), 5) for _ in range(40)]
    deadline = time.monotonic() + 10
    while len(launcher._pending) < 8 or sum(_closed(s) for s in silent) < 32:
        assert time.monotonic() < deadline, f"{len(launcher._pending)} pending"
        await asyncio.sleep(0.02)
    assert len(launcher._pending) == 8
    assert not any(_closed(s) for s in silent[-8:]), "the newest wait for their deadline"
    first = await asyncio.to_thread(_node, launcher)
    assert int(first) == len(sd.dial_source())
    for s in silent:
        s.close()


@pytest.mark.parametrize(
    "first_bytes",
    [
        pytest.param(b"GET / HTTP/1.0\r\n\r\n", id="not-tls"),
        pytest.param(b"MSCON-DIAL 1 boot 00\n", id="the-old-clear-handshake"),
        pytest.param(b"x" * 70000, id="a-long-line"),
    ],
)
async def test_junk_is_closed_at_once(launcher: sl.SlurmLauncher, first_bytes: bytes) -> None:
    sock = socket.create_connection(("127.0.0.1", launcher.port), 5)
    t0 = time.monotonic()
    with contextlib.suppress(OSError):
        sock.sendall(first_bytes)
    assert await asyncio.to_thread(_closed, sock, 5.0)
    assert time.monotonic() - t0 < 2.0
    sock.close()
    assert int(await asyncio.to_thread(_node, launcher)) == len(sd.dial_source())


async def test_a_dripped_handshake_is_cut_at_one_deadline(
    launcher: sl.SlurmLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate, "HANDSHAKE_S", 1.0)
    sock = socket.create_connection(("127.0.0.1", launcher.port), 5)
    t0 = time.monotonic()
    sock.sendall(b"\x16\x03\x01\x40\x00")  # a TLS record of 16 KiB announced, a byte every 0.2 s

    def drip() -> bool:
        for _ in range(50):
            with contextlib.suppress(OSError):
                sock.sendall(b"\0")
            if _closed(sock, 0.2):
                return True
        return False

    assert await asyncio.to_thread(drip)
    took = time.monotonic() - t0
    assert 0.9 <= took < 2.0, f"held {took:.1f}s"
    sock.close()


_CHILD = """
import asyncio, os, resource, sys
from mscon.console.config.inventory import load_inventory
from mscon.agent import gate
from mscon.console.transport import slurm_launcher as sl
gate.HANDSHAKE_S = 2.0
os.environ[sl.ENV_CONSOLE_ADDRESS] = "127.0.0.1"
async def main():
    la = sl.SlurmLauncher(load_inventory(sys.argv[1]))
    await la._listen()
    resource.setrlimit(resource.RLIMIT_NOFILE, (40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(la.port, la.keys.new_step(frozenset({"n1"}))[1].hex(), flush=True)
    sys.stdout.write(la.tls.cert.encode().hex() + " " + la.tls.key.encode().hex() + "\\n")
    sys.stdout.flush()
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def test_out_of_descriptors_the_port_pauses_and_a_node_still_gets_in(tmp_path: Path) -> None:
    err_file = (tmp_path / "err").open("w")  # a file: asyncio says so at every pause, a pipe fills up
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(REPO / "inventory" / "local.yaml")],
        stdout=subprocess.PIPE,
        stderr=err_file,
        text=True,
    )
    silent: list[socket.socket] = []
    try:
        assert child.stdout is not None
        port_s, key_hex = child.stdout.readline().split()
        cert_hex, tls_key_hex = child.stdout.readline().split()
        run = RunTls(bytes.fromhex(cert_hex).decode(), bytes.fromhex(tls_key_hex).decode())
        port = int(port_s)
        for _ in range(80):  # past the child's 40 descriptors: accepting fails with EMFILE
            silent.append(socket.create_connection(("127.0.0.1", port), 5))
        first = _node_at(port, run, bytes.fromhex(key_hex))
        assert int(first) == len(sd.dial_source())
        assert child.poll() is None
    finally:
        for s in silent:
            s.close()
        child.kill()
        child.wait()
        err_file.close()
    err = (tmp_path / "err").read_text()
    assert "Too many open files" in err or "out of system resource" in err, err[-2000:]


def _node_at(port: int, run: RunTls, key: bytes) -> bytes:
    deadline = time.monotonic() + 30
    while True:  # the port pauses while descriptors are short: a connection may time out
        try:
            s = tls.TlsSock(tls.connect("127.0.0.1", port, run.cert, run.key, 10))
        except OSError:
            assert time.monotonic() < deadline, "no node got in"
            continue
        try:
            f = dial.Lines(s)
            dial.dial_handshake(s, f, key, "boot")
            return f.readline()
        finally:
            s.close()
