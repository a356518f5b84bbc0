"""Connection failures are told in the order ssh meets them (the name resolves, the port connects,
it answers as an SSH server, then host keys, then authentication), each as one line with its
remedy, said once. Real parts: a name under ``.invalid`` (RFC 6761: never resolves), a closed port
on 127.0.0.1 and a tiny TCP server that answers like a web server. HOME is an empty folder, so no
known-hosts file exists: the host key is never what is blamed for what came before it."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port, mscon, write_inventory


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1"}
    env.pop("SSH_AUTH_SOCK", None)
    return env


def _inventory(tmp_path: Path, host: str, port: int) -> Path:
    workdir = tmp_path / "job"
    workdir.mkdir(exist_ok=True)
    (workdir / "train.py").write_text("print('hi')\n")
    return write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "order",
            "device_target": "CPU",
            "nodes": [{"host": host, "name": "vm", "devices": 1, "port": port, "user": "u"}],
            "job": {"workdir": str(workdir), "script": "train.py"},
            "ssh": {"connect_timeout_s": 5},  # no known_hosts: ssh's defaults under the empty HOME
        },
    )


@pytest.fixture
def not_ssh() -> Iterator[int]:
    """A port that answers as a web server does to an SSH client, then closes."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _one_line(tmp_path: Path, command: str, host: str, port: int) -> str:
    inv = _inventory(tmp_path, host, port)
    args = ["--no-tui"] if command == "run" else []
    done = mscon(
        command, inv, *args, "--logs-dir", tmp_path / "runs", cwd=tmp_path, env=_env(tmp_path), timeout=60
    )
    assert done.code == 4, done.err
    assert "Traceback" not in done.err
    lines = [x for x in done.err.splitlines() if "unreachable:" in x]
    assert len(lines) == 1, done.err  # one line for the one node
    (line,) = lines
    assert line.count(" -> ") == 1, line  # one remedy
    assert "known_hosts" not in line and "ssh-keyscan" not in line and "host key" not in line, line
    return line


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_name_that_does_not_resolve(tmp_path: Path, command: str) -> None:
    line = _one_line(tmp_path, command, "node-a.invalid", 22)
    assert line.startswith(
        "mscon: vm: unreachable: vm (node-a.invalid:22): cannot resolve node-a.invalid: "
    ), line
    assert line.endswith(
        "(via ssh) -> check the host name, or its HostName in your ssh config (ssh -G HOST shows it)"
    ), line


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_closed_port_is_refused_before_any_host_key(tmp_path: Path, command: str) -> None:
    port = free_port()  # nothing listens there
    line = _one_line(tmp_path, command, "127.0.0.1", port)
    assert line == (
        f"mscon: vm: unreachable: vm (127.0.0.1:{port}): cannot connect: Connection refused (via ssh) "
        "-> is sshd running on that host and port?"
    )


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_port_that_is_not_ssh(tmp_path: Path, command: str, not_ssh: int) -> None:
    line = _one_line(tmp_path, command, "127.0.0.1", not_ssh)
    assert line == (
        f"mscon: vm: unreachable: vm (127.0.0.1:{not_ssh}): not an SSH server: it answered "
        "'HTTP/1.1 400 Bad Request' instead of an SSH banner (via ssh) "
        "-> wrong port? the node's port (Port in your ssh config) must be sshd's"
    )
