"""Hostile and broken inputs at the SSH transport, against real sshd nodes on 127.0.0.2.

Node specs are built in Python, bypassing the inventory loader (which refuses such names): the
transport must be safe on its own. The login-shell tests create a throwaway user whose login
shell is fish, tcsh, zsh, bash or dash, and remove it afterwards.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import asyncssh
import pytest
from mscon.agent import layout
from mscon.agent.protocol import CheckResult, ChecksDone, Hello, RunChecks
from mscon.console.config.inventory import NodeSpec, SshSpec
from mscon.console.transport import NodeUnreachable, SshOptions
from mscon.console.transport.bundle import AGENT_PACKAGE, agent_bundle, agent_command
from mscon.console.transport.ssh import SshTransport
from sshd_nodes import SshdCluster

pytestmark = pytest.mark.ssh

# Values that would run a command if they reached a login shell's command line: quotes of both
# kinds, ;, $( ), backquotes, fish's ( ), csh's "!" and newline, backslashes before quotes (what
# broke fish with shlex.quote'd words). {m}: a folder every user may write to, watched by the test.
HOSTILE_NODES = [
    "n1'\"; touch {m}/p1; echo $(touch {m}/p2) `touch {m}/p3` (touch {m}/p4) !! ;",
    "a\\'\\';touch {m}/p5;#",
    "x\n;touch {m}/p6",
]
# A python path cannot hold "/" in a name: these touch files in the login's working folder.
HOSTILE_PY_NAMES = ["py'\"; touch p7; $(touch p8) `touch p9` (touch p10) !! ;", "py\\'\\';touch p11;#"]
LOGIN_SHELLS = ["fish", "tcsh", "zsh", "bash", "dash"]
NODE_PYTHON = "/usr/bin/python3"  # readable by any user (the console's may live under /root)


@pytest.fixture
def cluster(sshd_node: SshdCluster) -> SshdCluster:
    return sshd_node


def _transport(
    cluster: SshdCluster,
    name: str = "node1",
    *,
    user: str = "root",
    known_hosts: Path | None = None,
    accept_new: bool = False,
    config: Path | None = None,
) -> SshTransport:
    n = cluster.nodes[0]
    node = NodeSpec(
        name=name, host=n.host, devices=1, user=user, port=n.port, identity_file=str(cluster.client_key)
    )
    inv = SimpleNamespace(
        ssh=SshSpec(
            known_hosts=str(known_hosts or cluster.known_hosts),
            config=str(config) if config else None,
            connect_timeout_s=5,
        )
    )
    return SshTransport(node, inv, SshOptions(accept_new_host_keys=accept_new))  # type: ignore[arg-type]


@contextmanager
def _throwaway_user(shell: str, cluster: SshdCluster) -> Iterator[str]:
    """A user with ``shell`` as login shell, authorized for the cluster's client key."""
    for tool in ("useradd", "userdel", "usermod"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: cannot create a user with a {shell} login shell")
    name = f"mscon{secrets.token_hex(4)}"
    subprocess.run(["useradd", "-m", "-s", shell, name], check=True, capture_output=True)
    try:
        # sshd (UsePAM no) refuses a locked account ("!" password) even for key logins.
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        pw = pwd.getpwnam(name)
        ssh_dir = Path(pw.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        keys = ssh_dir / "authorized_keys"
        keys.write_text(cluster.client_key.with_name("client_key.pub").read_text())
        for p in (ssh_dir, keys):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        # The cluster's own authorized_keys lies in root's pytest folder; let sshd read the user's.
        node = cluster.nodes[0]
        config = node.config.read_text()
        config = config.replace(
            f"AuthorizedKeysFile {cluster.authorized_keys}",
            f"AuthorizedKeysFile {cluster.authorized_keys} .ssh/authorized_keys",
        )
        node.config.write_text(config)
        cluster.restart_node(node)
        yield name
    finally:
        subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


@contextmanager
def _world_writable_dir(prefix: str, mode: int) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        path.chmod(mode)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("shell", LOGIN_SHELLS)
async def test_hostile_node_names_and_python_paths_run_nothing(
    cluster: SshdCluster, shell: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(
            f"{shell} is not installed, so a {shell} login shell is not tested (apt-get install -y {shell})"
        )
    if not os.access(NODE_PYTHON, os.X_OK):
        pytest.skip(f"{NODE_PYTHON} is missing: the throwaway user needs a python it can run")
    sent: list[str] = []
    create_process = asyncssh.SSHClientConnection.create_process

    async def spy(self, command=None, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        sent.append(command)
        return await create_process(self, command, *args, **kwargs)

    monkeypatch.setattr(asyncssh.SSHClientConnection, "create_process", spy)
    with (
        _throwaway_user(exe, cluster) as user,
        _world_writable_dir("mscon-marks-", 0o777) as marks,
        _world_writable_dir("mscon-bin-", 0o755) as bindir,
    ):
        home = Path(pwd.getpwnam(user).pw_dir)
        pythons = []
        for py_name in HOSTILE_PY_NAMES:
            (bindir / py_name).symlink_to(NODE_PYTHON)
            pythons.append(str(bindir / py_name))
        for i, template in enumerate(HOSTILE_NODES):
            node, python = template.format(m=marks), pythons[i % len(pythons)]
            t = _transport(cluster, node, user=user)
            await t.connect()
            try:
                assert t.home == str(home)
                channel = await t.start_agent(await t.ensure_agent(agent_bundle()), python)
                hello = await asyncio.wait_for(channel.recv(), 30)
                assert isinstance(hello, Hello), channel.stderr_tail()
                assert hello.node == node  # it arrived intact, through stdin
                await channel.close(wait_s=10)
            finally:
                await t.close()
        assert sent == [agent_command()] * len(HOSTILE_NODES)  # the same fixed string every time
        assert all(v not in sent[0] for v in pythons + [user, "n1'", "touch"])
        assert sorted(marks.iterdir()) == []
        assert [p.name for p in home.iterdir() if p.name.startswith("p")] == []


async def test_missing_known_hosts_then_accept_new_then_changed_key(
    tmp_path: Path, cluster: SshdCluster
) -> None:
    node = cluster.nodes[0]
    kh = tmp_path / "fresh-home" / ".ssh" / "known_hosts"  # a fresh ~/.ssh: not even the folder
    with pytest.raises(NodeUnreachable) as refused:
        await _transport(cluster, known_hosts=kh).connect()
    assert str(refused.value) == (
        f"node1 (127.0.0.2:{node.port}): no known host keys yet ({kh} does not exist): verify the host key "
        f"and add it (ssh-keyscan -p {node.port} 127.0.0.2 >> {kh}), or pass --accept-new-host-keys"
    )
    assert not kh.parent.exists()  # nothing was written without the opt-in

    t = _transport(cluster, known_hosts=kh, accept_new=True)
    await t.connect()
    await t.close()
    learned = node.known_hosts_line + "\n"
    assert kh.read_text() == learned
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600
    assert stat.S_IMODE(kh.parent.stat().st_mode) == 0o700
    t = _transport(cluster, known_hosts=kh)  # now known: no opt-in needed
    await t.connect()
    await t.close()

    cluster.rotate_host_key(node)
    with pytest.raises(NodeUnreachable, match="HOST KEY MISMATCH"):
        await _transport(cluster, known_hosts=kh, accept_new=True).connect()  # never accepted
    assert kh.read_text() == learned  # and never overwritten


async def test_aes_gcm_first_unless_the_ssh_config_chose_the_ciphers(
    tmp_path: Path, cluster: SshdCluster
) -> None:
    """asyncssh's first choice, ChaCha20-Poly1305, costs the console ~45 % more CPU per packet."""
    empty = tmp_path / "ssh_config"
    empty.write_text("")
    t = _transport(cluster, config=empty)
    await t.connect()
    assert (t.conn.get_extra_info("send_cipher"), t.conn.get_extra_info("recv_cipher")) == (
        "aes128-gcm@openssh.com",
        "aes128-gcm@openssh.com",
    )
    await t.close()
    chosen = tmp_path / "ssh_config_ciphers"
    chosen.write_text("Host *\n  Ciphers chacha20-poly1305@openssh.com,aes256-ctr\n")
    t = _transport(cluster, config=chosen)
    await t.connect()
    assert t.conn.get_extra_info("send_cipher") == "chacha20-poly1305@openssh.com"  # as the user chose
    await t.close()


async def test_accept_new_appends_on_a_line_of_its_own(tmp_path: Path, cluster: SshdCluster) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("# no trailing newline")
    kh.chmod(0o644)
    with pytest.raises(NodeUnreachable, match="unknown host key .*ssh-keyscan -p"):
        await _transport(cluster, known_hosts=kh).connect()
    t = _transport(cluster, known_hosts=kh, accept_new=True)
    await t.connect()
    await t.close()
    assert kh.read_text().splitlines() == ["# no trailing newline", cluster.nodes[0].known_hosts_line]
    assert stat.S_IMODE(kh.stat().st_mode) == 0o644  # an existing file keeps its mode


async def test_fetch_does_not_follow_links_out_of_the_run_dir(tmp_path: Path, cluster: SshdCluster) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the node user's secret\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_text("not a log\n")
    t = _transport(cluster)
    await t.connect()
    run_id = f"hostile-{secrets.token_hex(4)}"
    run = Path(t.run_dir(run_id))  # the sshd node is this machine: write its run folder directly
    try:
        attempt = Path(layout.attempt_folder(run, 0))
        attempt.mkdir(parents=True)
        Path(layout.log_file(attempt, "r0")).write_text("step 1\n")
        (attempt / "leak.log").symlink_to(secret)
        (attempt / "dirlink").symlink_to(outside)
        (run / "escape").symlink_to("../../..")
        work = Path(layout.work_folder(str(run)))
        work.mkdir()
        (work / "train.py").write_text("synced, not a log\n")
        logs = tmp_path / "logs"
        await t.fetch_run_dir(str(run), str(logs / "node1"), logs_root=str(logs))
        got = sorted(str(p.relative_to(logs)) for p in logs.rglob("*"))
        assert got == ["node1", layout.attempt_folder("node1", 0), layout.log_path("node1", 0, "r0")]
        assert Path(layout.log_path(logs / "node1", 0, "r0")).read_text() == "step 1\n"
        with pytest.raises(ValueError, match="would not stay inside"):
            await t.fetch_run_dir(str(run), str(tmp_path / "elsewhere"), logs_root=str(logs))
        with pytest.raises(ValueError, match="is not a run folder"):
            await t.fetch_run_dir("/etc", str(logs / "node1"), logs_root=str(logs))
    finally:
        await t.close()
        shutil.rmtree(run.parent, ignore_errors=True)


async def test_hostile_node_name_is_refused_before_anything_is_written(
    tmp_path: Path, cluster: SshdCluster
) -> None:
    t = _transport(cluster, "../../x")
    await t.connect()
    try:
        with pytest.raises(ValueError, match="node name"):
            t.run_dir("r1")
        logs = tmp_path / "a" / "b" / "logs"
        with pytest.raises(ValueError):
            await t.fetch_run_dir(
                layout.run_folder(t.cache_root, "r1", "x"), str(logs / "../../x"), logs_root=str(logs)
            )
        with pytest.raises(ValueError):
            await t.fetch_run_dir(layout.run_folder(t.cache_root, "r1", "x"), str(logs / "../../x"))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sshd"]
    finally:
        await t.close()


async def test_agent_stderr_is_escaped_and_bad_python_paths_refused(
    tmp_path: Path, cluster: SshdCluster
) -> None:
    noisy = tmp_path / "noisy-python"  # writes terminal control sequences, then fails
    noisy.write_text("#!/bin/sh\nprintf '\\033]0;owned\\007\\033[2Jgone\\r\\n' >&2\nexit 3\n")
    noisy.chmod(0o755)
    t = _transport(cluster)
    await t.connect()
    try:
        agent_dir = await t.ensure_agent(agent_bundle())
        channel = await t.start_agent(agent_dir, str(noisy))
        assert await asyncio.wait_for(channel.recv(), 30) is None
        await channel.close()
        assert channel.stderr_tail() == "\\x1b]0;owned\\x07\\x1b[2Jgone\\x0d\n"
        channel = await t.start_agent(agent_dir, "/no/such/python3")
        assert await asyncio.wait_for(channel.recv(), 30) is None
        await channel.close()
        assert "No such file or directory" in channel.stderr_tail()
        for bad in (f"{sys.executable}\ntouch {tmp_path}/p", "-c"):
            with pytest.raises(NodeUnreachable, match="unusable python path"):
                await t.start_agent(agent_dir, bad)
        assert not (tmp_path / "p").exists()
    finally:
        await t.close()


async def test_sftp_deploys_the_agents_sub_packages_and_the_agent_runs_from_them(
    tmp_path: Path, cluster: SshdCluster
) -> None:
    """A node with nothing deployed gets every file of the bundle, sub-package folders included
    (checks/...), each inside the agent's folder; the agent started from it answers RunChecks."""
    t = _transport(cluster)
    await t.connect()
    try:
        t.home = str(tmp_path / "node-home")  # the sshd node is this machine: a folder never deployed to
        bundle = agent_bundle()
        agent_dir = await t.ensure_agent(bundle)
        pkg = Path(agent_dir) / AGENT_PACKAGE
        assert any("/" in name for name in bundle.files)
        assert {p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")} == set(bundle.files)
        assert not [p for p in (tmp_path / "node-home").rglob("*.tmp-*")]  # every upload renamed
        channel = await t.start_agent(agent_dir, NODE_PYTHON)
        try:
            assert isinstance(await asyncio.wait_for(channel.recv(), 30), Hello), channel.stderr_tail()
            await channel.send(RunChecks(names=("clock", "limits")))
            got = []
            while not isinstance(msg := await asyncio.wait_for(channel.recv(), 30), ChecksDone):
                assert isinstance(msg, CheckResult), (msg, channel.stderr_tail())
                got.append(msg.name)
            assert got == ["clock", "limits.memlock", "limits.nofile"]
        finally:
            await channel.close()
    finally:
        await t.close()


def test_keepalive_reads_either_spelling_and_gives_up_after_one_miss() -> None:
    def kwargs(**ssh: float) -> dict:
        spec = SimpleNamespace(known_hosts=None, config=None, connect_timeout_s=5.0, **ssh)
        node = NodeSpec(name="n", host="h", devices=1)
        return SshTransport(node, SimpleNamespace(ssh=spec), SshOptions())._connect_kwargs()  # type: ignore[arg-type]

    assert kwargs(keepalive_s=2.0)["keepalive_interval"] == 2.0
    assert kwargs(keepalive_interval_s=7.0)["keepalive_interval"] == 7.0
    assert kwargs()["keepalive_interval"] == 5.0
    assert kwargs(keepalive_s=3.0)["keepalive_count_max"] == 1
