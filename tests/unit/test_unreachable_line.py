"""A node that cannot be reached is one line: the node, the error, the transport it failed on (ssh,
srun, local: never "ssh" for all) and the remedy; the summary records the transport's name too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import free_port, mscon, write_inventory
from mscon.console.transport import reach
from mscon.console.transport.base import TransportKind
from mscon.console.transport.local import LocalTransport
from mscon.console.transport.slurm import SlurmTransport
from mscon.console.transport.ssh import SshTransport


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(home), "NO_COLOR": "1"}


def _job(tmp_path: Path) -> dict:
    workdir = tmp_path / "job"  # beside the home folder, not above it
    workdir.mkdir(exist_ok=True)
    (workdir / "train.py").write_text("print('hi')\n")
    return {"workdir": str(workdir), "script": "train.py"}


def _closed_port_inventory(tmp_path: Path, port: int) -> Path:
    (tmp_path / "known_hosts").write_text("")
    return write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "closed",
            "device_target": "CPU",
            "nodes": [{"host": "127.0.0.1", "name": "vm", "devices": 1, "port": port, "user": "u"}],
            "job": _job(tmp_path),
            "ssh": {"known_hosts": str(tmp_path / "known_hosts"), "connect_timeout_s": 5},
        },
    )


def _missing_python_inventory(tmp_path: Path) -> Path:
    return write_inventory(
        tmp_path / "local.yaml",
        {
            "name": "nopython",
            "device_target": "CPU",
            "nodes": [
                {
                    "host": "localhost",
                    "name": "here",
                    "transport": "local",
                    "devices": 1,
                    "python": "/nonexistent/bin/python3",
                }
            ],
            "job": _job(tmp_path),
        },
    )


def test_every_transport_names_its_kind() -> None:
    assert {SshTransport.kind, SlurmTransport.kind, LocalTransport.kind} == set(TransportKind)
    assert [k.value for k in TransportKind] == ["ssh", "srun", "local"]


def test_the_line_names_transport_and_remedy() -> None:
    line = reach.line(TransportKind.SSH, "vm (h:22): cannot connect: Connection refused")
    assert (
        line
        == "vm (h:22): cannot connect: Connection refused (via ssh) -> is sshd running on that host and port?"
    )
    srun = reach.line(TransportKind.SRUN, "vm: no agent connected; srun exited with 127: exec: /x: not found")
    assert "(via srun)" in srun and "ssh" not in srun.replace("(via srun)", "") and "python:" in srun
    assert reach.line(TransportKind.LOCAL, "here: something odd") == "here: something odd (via local)"


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_refused_connection_is_one_line(tmp_path: Path, command: str) -> None:
    port = free_port()  # nothing listens there
    inv = _closed_port_inventory(tmp_path, port)
    args = ["--no-tui"] if command == "run" else []
    done = mscon(
        command,
        inv,
        *args,
        "--logs-dir",
        tmp_path / "runs",
        "--json",
        tmp_path / "s.json",
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=60,
    )
    assert done.code == 4, done.err
    said = [line for line in done.err.splitlines() if "Connection refused" in line]
    assert said == [
        f"mscon: vm: unreachable: vm (127.0.0.1:{port}): cannot connect: Connection refused (via ssh) "
        "-> is sshd running on that host and port?"
    ], done.err
    assert "--skip-check" not in done.err and "node  " not in done.err and "to fix" not in done.err
    assert "Traceback" not in done.err
    if command == "run":
        assert "unreachable in" in done.err and "vm (see above)" in done.err
    summary = json.loads((tmp_path / "s.json").read_text())
    assert (
        summary["preflight"]["failed"] == ["vm: ssh"]
        if "preflight" in summary
        else summary["failed"] == ["vm: ssh"]
    )


def test_a_local_node_that_fails_is_not_called_ssh(tmp_path: Path) -> None:
    inv = _missing_python_inventory(tmp_path)
    done = mscon("check", inv, "--json", tmp_path / "s.json", cwd=tmp_path, env=_env(tmp_path), timeout=60)
    assert done.code == 4, done.err
    (line,) = [line for line in done.err.splitlines() if "unreachable:" in line]
    assert line.startswith("mscon: here: unreachable: ") and "(via local) -> check python:" in line, line
    assert "ssh" not in line
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["failed"] == ["here: local"]
