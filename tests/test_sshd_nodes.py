"""Tests for the real-sshd test helper in tests/sshd_nodes.py."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshd_nodes import (  # noqa: E402
    SshdCluster,
    SshdError,
    SshdNode,
    descendants,
    pid_alive,
    require_sshd,
    start_sshd_cluster,
    write_known_hosts,
)

pytestmark = pytest.mark.ssh

asyncssh = pytest.importorskip("asyncssh")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SshdCluster]:
    require_sshd()
    c = start_sshd_cluster(tmp_path / "sshd", n=2)
    try:
        yield c
    finally:
        c.stop()


def _ssh_cmd(c: SshdCluster, node: SshdNode, command: str, known_hosts: Path | None = None) -> list[str]:
    opts = {
        "IdentitiesOnly": "yes",
        "UserKnownHostsFile": str(known_hosts or c.known_hosts),
        "GlobalKnownHostsFile": "/dev/null",
        "StrictHostKeyChecking": "yes",
        "BatchMode": "yes",
        "ConnectTimeout": "5",
    }
    argv = ["ssh", "-F", "/dev/null", "-i", str(c.client_key), "-p", str(node.port)]
    for k, v in opts.items():
        argv += ["-o", f"{k}={v}"]
    return [*argv, f"root@{node.host}", command]


def _connect(c: SshdCluster, node: SshdNode, known_hosts: Path | None = None):  # type: ignore[no-untyped-def]
    return asyncssh.connect(
        node.host,
        port=node.port,
        username="root",
        client_keys=[str(c.client_key)],
        known_hosts=str(known_hosts or c.known_hosts),
        agent_path=None,
        config=None,
        connect_timeout=5,
    )


def _our_processes(c: SshdCluster) -> list[int]:
    """Live processes whose command line mentions the cluster's workdir."""
    needle = str(c.workdir).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def test_layout(cluster: SshdCluster) -> None:
    assert [n.name for n in cluster.nodes] == ["node1", "node2"]
    assert [n.host for n in cluster.nodes] == ["127.0.0.2", "127.0.0.3"]
    assert len({n.port for n in cluster.nodes}) == 1
    lines = cluster.known_hosts.read_text().splitlines()
    assert len(lines) == 2
    for node, line in zip(cluster.nodes, lines, strict=True):
        assert line.startswith(f"[{node.host}]:{node.port} ssh-ed25519 AAAA")
        assert pid_alive(node.pid)
    assert (cluster.client_key.stat().st_mode & 0o777) == 0o600


def test_openssh_client_echo(cluster: SshdCluster) -> None:
    for node in cluster.nodes:
        r = subprocess.run(
            _ssh_cmd(cluster, node, "echo ok"),
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout == "ok\n"


def test_asyncssh_run_and_sftp_put(cluster: SshdCluster, tmp_path: Path) -> None:
    local = tmp_path / "payload.txt"
    local.write_text("hello from mscon\n")
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()

    async def main() -> None:
        for node in cluster.nodes:
            async with _connect(cluster, node) as conn:
                result = await conn.run("echo hi", check=True)
                assert result.stdout == "hi\n"
                async with conn.start_sftp_client() as sftp:
                    await sftp.put(str(local), str(remote_dir / f"{node.name}.txt"))

    asyncio.run(main())
    for node in cluster.nodes:  # "remote" is this machine
        assert (remote_dir / f"{node.name}.txt").read_text() == "hello from mscon\n"


def test_rotate_host_key_breaks_known_hosts(cluster: SshdCluster, tmp_path: Path) -> None:
    node = cluster.nodes[0]
    old_pid = node.pid
    cluster.rotate_host_key(node)
    rotated = cluster.node("node1")
    assert rotated.pid != old_pid and pid_alive(rotated.pid)

    async def connect_and_run(n: SshdNode, kh: Path | None = None) -> str:
        async with _connect(cluster, n, kh) as conn:
            return (await conn.run("echo hi", check=True)).stdout

    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(connect_and_run(rotated))
    # untouched node still fine with the old file
    assert asyncio.run(connect_and_run(cluster.nodes[1])) == "hi\n"
    # OpenSSH client refuses too
    r = subprocess.run(
        _ssh_cmd(cluster, rotated, "echo ok"),
        capture_output=True,
        text=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in r.stderr
    # a freshly written known_hosts matches again
    fresh = write_known_hosts(tmp_path / "kh_fresh", cluster.nodes)
    assert asyncio.run(connect_and_run(rotated, fresh)) == "hi\n"


def test_stop_node_makes_it_unreachable(cluster: SshdCluster) -> None:
    node = cluster.nodes[1]
    cluster.stop_node(node)
    assert not cluster.is_running(node)
    assert not pid_alive(node.pid)

    async def attempt(n: SshdNode) -> str:
        async with _connect(cluster, n) as conn:
            return (await conn.run("echo hi", check=True)).stdout

    with pytest.raises(ConnectionRefusedError):
        asyncio.run(attempt(node))
    assert asyncio.run(attempt(cluster.nodes[0])) == "hi\n"  # other node unaffected

    restarted = cluster.start_node(node)
    assert restarted.pid != node.pid
    assert cluster.node(node.name) == restarted
    assert asyncio.run(attempt(restarted)) == "hi\n"


def test_stop_kills_everything(cluster: SshdCluster) -> None:
    listener_pids = [n.pid for n in cluster.nodes]

    async def main() -> None:
        # keep a session with a long-running command open on each node
        conns = []
        try:
            for node in cluster.nodes:
                conn = await _connect(cluster, node)
                conns.append(conn)
                proc = await conn.create_process("echo started; exec sleep 300")
                assert (await proc.stdout.readline()) == "started\n"
            children = [p for pid in listener_pids for p in descendants(pid)]
            assert len(children) >= 2 * len(cluster.nodes)  # per-conn sshd + sleep
            await asyncio.to_thread(cluster.stop)
            for pid in listener_pids + children:
                assert not pid_alive(pid), f"pid {pid} survived stop()"
        finally:
            for conn in conns:
                conn.abort()

    asyncio.run(main())
    assert _our_processes(cluster) == []
    stopped = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    for pid in listener_pids:
        assert not any(line.split()[0] == str(pid) for line in stopped.splitlines()[1:])
    cluster.stop()  # idempotent


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    require_sshd()
    with socket.socket() as s:
        s.bind(("127.0.0.3", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SshdError, match=f"port {port} is already in use on 127.0.0.3"):
            start_sshd_cluster(tmp_path / "sshd", n=2, port=port)
