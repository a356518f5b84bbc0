"""Host keys where OpenSSH looks for them, over real sshd nodes on 127.0.0.x, with HOME an empty folder.

The inventories name their nodes only as ssh config aliases and set no ``ssh.known_hosts``: the
known-hosts files come from the ssh config (``UserKnownHostsFile``, ``GlobalKnownHostsFile``) or
OpenSSH's defaults under ``$HOME``, exactly as ``ssh node1-alias`` would read them.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import asyncssh
import pytest
import yaml
from conftest import FAKE_RANK, REPO, SSH_USER, Done, mscon, ssh_inventory
from mscon.console.config.inventory import NodeSpec, SshSpec
from mscon.console.transport import NodeUnreachable, SshOptions
from mscon.console.transport.host_keys import (
    DEFAULT_GLOBAL_FILES,
    DEFAULT_USER_FILES,
    Target,
    config_paths,
    host_key_files,
)
from mscon.console.transport.ssh import SshTransport
from sshd_nodes import SshdCluster, SshdNode, write_known_hosts

pytestmark = pytest.mark.ssh
FAKE = str(FAKE_RANK.relative_to(REPO))
CLIENT_ADDRESS = "127.0.0.9"  # where the console's own connections come from in the bastion test


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home)}


def _alias_block(node: SshdNode, extra: str = "") -> str:
    return f"Host {node.name}-alias\n  HostName {node.host}\n  Port {node.port}\n{extra}"


def _inventory(tmp_path: Path, cluster: SshdCluster, nodes: list[SshdNode], config: str) -> Path:
    """An inventory naming ``nodes`` by their ssh config aliases only, and no ``ssh.known_hosts``."""
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(config + f"Host *\n  User {SSH_USER}\n  IdentityFile {cluster.client_key}\n")
    inv = ssh_inventory(tmp_path / "inv.yaml", cluster, 1, FAKE, ["--steps", "3", "--rate", "0"])
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"] = {"python": sys.executable}  # user, port and key come from the config
    doc["nodes"] = [{"host": f"{n.name}-alias", "name": n.name, "devices": 1} for n in nodes]
    doc["ssh"] = {"config": str(ssh_config), "connect_timeout_s": 5}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def _run(inv: Path, home: Path, *flags: str) -> Done:
    return mscon("run", "--no-tui", inv, *flags, cwd=inv.parent, env=_env(home))


def _trained(done: Done, names: list[str]) -> bool:
    return done.code == 0 and all(f"[{n} r{i}] training finished" in done.out for i, n in enumerate(names))


def _lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


# ------------------------------------------------------------------ where the keys are looked up


def test_keys_only_in_the_file_the_config_names(
    tmp_path: Path, sshd_cluster: SshdCluster, home: Path
) -> None:
    """`UserKnownHostsFile` of the matching Host block, with ~ expanded from $HOME as ssh does."""
    nodes = sshd_cluster.nodes
    site = home / "site"
    site.mkdir()
    write_known_hosts(site / "cluster_hosts", nodes)
    absent_global = tmp_path / "no-global-file"
    files = f"  UserKnownHostsFile ~/site/cluster_hosts\n  GlobalKnownHostsFile {absent_global}\n"
    config = "".join(_alias_block(n, files) for n in nodes)
    inv = _inventory(tmp_path, sshd_cluster, nodes, config)
    done = _run(inv, home)
    assert _trained(done, ["node1", "node2"]), done.err[-3000:]
    assert not (home / ".ssh").exists()  # nothing learned, nothing written

    # The same config without the UserKnownHostsFile line: ssh's defaults under $HOME, which do not
    # exist; the one-line refusal names every file it looked at.
    config = "".join(_alias_block(n, f"  GlobalKnownHostsFile {absent_global}\n") for n in nodes)
    inv = _inventory(tmp_path, sshd_cluster, nodes, config)
    refused = _run(inv, home)
    assert refused.code == 4, refused.err
    looked = f"{home}/.ssh/known_hosts, {home}/.ssh/known_hosts2, {absent_global}"
    assert f"node1 (node1-alias): no known host keys yet (none of {looked} exists)" in refused.err


def test_keys_only_in_a_global_known_hosts_file(
    tmp_path: Path, sshd_cluster: SshdCluster, home: Path
) -> None:
    """`GlobalKnownHostsFile` (as sites distribute keys in /etc/ssh/ssh_known_hosts; a temp file here).
    A malformed line in it is skipped, as ssh skips it."""
    global_file = tmp_path / "ssh_known_hosts"
    write_known_hosts(global_file, sshd_cluster.nodes)
    global_file.write_text("this line is not an entry\n" + global_file.read_text())
    aliases = "".join(_alias_block(n) for n in sshd_cluster.nodes)
    config = aliases + f"Host *\n  GlobalKnownHostsFile {global_file}\n"
    inv = _inventory(tmp_path, sshd_cluster, sshd_cluster.nodes, config)
    done = _run(inv, home)
    assert _trained(done, ["node1", "node2"]), done.err[-3000:]
    assert not (home / ".ssh").exists()  # the user's files (defaults, absent) were only looked at


def test_changed_key_names_the_file_and_line(tmp_path: Path, sshd_cluster: SshdCluster, home: Path) -> None:
    kh = tmp_path / "cluster_hosts"
    write_known_hosts(kh, sshd_cluster.nodes)
    kh.write_text("# node1 then node2\n" + kh.read_text())  # node2's entry is on line 3
    before = kh.read_text()
    sshd_cluster.rotate_host_key("node2")
    config = "".join(_alias_block(n) for n in sshd_cluster.nodes) + f"Host *\n  UserKnownHostsFile {kh}\n"
    inv = _inventory(tmp_path, sshd_cluster, sshd_cluster.nodes, config)
    done = _run(inv, home, "--accept-new-host-keys")  # learning never replaces a changed key
    assert done.code == 4, done.err
    lines = _lines_with(done.err, "HOST KEY MISMATCH")  # the error, on one line wherever it is shown
    assert lines and all("node2 (node2-alias): HOST KEY MISMATCH" in x and f"{kh}:3;" in x for x in lines)
    assert "node1 (node1-alias): HOST KEY" not in done.err
    assert "Traceback" not in done.err
    assert kh.read_text() == before


# ------------------------------------------------------------------ through a ProxyJump bastion


def behind_bastion(cluster: SshdCluster) -> tuple[list[SshdNode], SshdNode]:
    """node1 and node2 accept root only from 127.0.0.1; node3, the bastion, forwards TCP.

    On loopback the bastion's forwarded connections come from 127.0.0.1 (the kernel's source
    address for 127.0.0.0/8), while the console's own connections come from ``CLIENT_ADDRESS``
    (``BindAddress`` in its ssh config): so the nodes refuse the console directly and accept it
    only through the bastion. The test shows both."""
    nodes, bastion = cluster.nodes[:2], cluster.nodes[2]
    text = bastion.config.read_text().replace("AllowTcpForwarding no", "AllowTcpForwarding yes")
    bastion.config.write_text(text.replace("LogLevel ERROR", "LogLevel VERBOSE"))
    cluster.restart_node(bastion)
    for n in nodes:
        text = n.config.read_text().replace("LogLevel ERROR", "LogLevel VERBOSE")
        n.config.write_text(text + f"AllowUsers {SSH_USER}@127.0.0.1\n")
        cluster.restart_node(n)
    return cluster.nodes[:2], cluster.nodes[2]


def test_node_behind_a_proxyjump_bastion_learns_keys_through_it(
    tmp_path: Path, cluster3: SshdCluster, home: Path
) -> None:
    nodes, bastion = behind_bastion(cluster3)
    jump = "  ProxyJump bastion\n"
    common = (
        f"Host bastion\n  HostName {bastion.host}\n  Port {bastion.port}\n"
        f"Host *\n  BindAddress {CLIENT_ADDRESS}\n"
    )
    inv = _inventory(tmp_path, cluster3, nodes, "".join(_alias_block(n, jump) for n in nodes) + common)

    refused = _run(inv, home)  # nothing known yet, no opt-in
    assert refused.code == 4 and "no known host keys yet" in refused.err, refused.err
    assert "ssh node1-alias records it in" in refused.err  # ssh-keyscan cannot go through a bastion

    learned = _run(inv, home, "--accept-new-host-keys")
    assert _trained(learned, ["node1", "node2"]), learned.err[-3000:]
    kh = home / ".ssh" / "known_hosts"  # the first UserKnownHostsFile, OpenSSH's default
    assert sorted(kh.read_text().splitlines()) == sorted(n.known_hosts_line for n in [*nodes, bastion])
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600 and stat.S_IMODE(kh.parent.stat().st_mode) == 0o700
    again = _run(inv, home)  # recorded: no opt-in needed any more
    assert _trained(again, ["node1", "node2"]), again.err[-3000:]

    # The route: the bastion saw the console (from CLIENT_ADDRESS), the nodes only the bastion.
    assert f"Accepted publickey for root from {CLIENT_ADDRESS}" in bastion.log.read_text()
    for n in nodes:
        log = n.log.read_text()
        assert "Accepted publickey for root from 127.0.0.1" in log and CLIENT_ADDRESS not in log
    # And the direct route is closed: the same config without ProxyJump is refused by the nodes.
    direct = _inventory(tmp_path, cluster3, nodes, "".join(_alias_block(n) for n in nodes) + common)
    done = _run(direct, home)
    assert done.code == 4 and "node1 (node1-alias): authentication failed" in done.err, done.err
    assert "not allowed because not listed in AllowUsers" in nodes[0].log.read_text()


# ------------------------------------------------------------------ settings that would turn checking off


@pytest.fixture
def cluster1(sshd_node: SshdCluster) -> SshdCluster:
    return sshd_node


def _transport(cluster: SshdCluster, config: Path, accept_new: bool = False) -> SshTransport:
    node = NodeSpec(name="node1", host="node1-alias", devices=1, identity_file=str(cluster.client_key))
    inv = SimpleInventory(SshSpec(config=str(config), connect_timeout_s=5))
    return SshTransport(node, inv, SshOptions(accept_new_host_keys=accept_new))  # type: ignore[arg-type]


class SimpleInventory:
    def __init__(self, ssh: SshSpec) -> None:
        self.ssh = ssh


@pytest.mark.parametrize(
    "off", ["StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null", "UserKnownHostsFile none"]
)
async def test_a_config_that_turns_checking_off_does_not(
    tmp_path: Path, cluster1: SshdCluster, home: Path, monkeypatch: pytest.MonkeyPatch, off: str
) -> None:
    monkeypatch.setenv("HOME", str(home))
    node = cluster1.nodes[0]
    config = tmp_path / "ssh_config"
    absent = tmp_path / "no-global-file"
    config.write_text(_alias_block(node, f"  User {SSH_USER}\n  {off}\n  GlobalKnownHostsFile {absent}\n"))
    with pytest.raises(NodeUnreachable) as refused:
        await _transport(cluster1, config).connect()
    message = str(refused.value)
    assert "mscon checks host keys all the same" in message, message
    if "none" in off:  # no user file at all: only the global one was looked at, and it is absent
        assert f"no known host keys yet ({absent} does not exist)" in message
        with pytest.raises(NodeUnreachable, match="nowhere to record"):
            await _transport(cluster1, config, accept_new=True).connect()
    else:
        assert "unknown host key (no entry in /dev/null)" in message


async def test_a_revoked_key_is_refused_even_when_learning(
    tmp_path: Path, cluster1: SshdCluster, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(home))
    node = cluster1.nodes[0]
    kh = tmp_path / "hosts"
    kh.write_text(f"@revoked {node.known_hosts_line}\n")
    config = tmp_path / "ssh_config"
    config.write_text(_alias_block(node, f"  User {SSH_USER}\n  UserKnownHostsFile {kh}\n"))
    with pytest.raises(NodeUnreachable, match=f"is marked @revoked in {kh}:1; refusing to connect"):
        await _transport(cluster1, config, accept_new=True).connect()
    assert kh.read_text() == f"@revoked {node.known_hosts_line}\n"


async def test_the_jump_hosts_key_is_checked_too(
    tmp_path: Path, cluster3: SshdCluster, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bastion whose key changed is refused like a node, naming the bastion."""
    monkeypatch.setenv("HOME", str(home))
    nodes, bastion = behind_bastion(cluster3)
    kh = tmp_path / "hosts"
    write_known_hosts(kh, [*nodes, bastion])
    cluster3.rotate_host_key(bastion)
    config = tmp_path / "ssh_config"
    config.write_text(
        _alias_block(nodes[0], "  ProxyJump bastion\n")
        + f"Host bastion\n  HostName {bastion.host}\n  Port {bastion.port}\n"
        + f"Host *\n  User {SSH_USER}\n  IdentityFile {cluster3.client_key}\n  UserKnownHostsFile {kh}\n"
    )
    with pytest.raises(NodeUnreachable) as refused:
        await _transport(cluster3, config, accept_new=True).connect()
    assert str(refused.value).startswith("node1 (node1-alias): jump host bastion: HOST KEY MISMATCH")
    assert f"{kh}:3;" in str(refused.value)


# ------------------------------------------------------------------ the file lists (no network)


def test_file_lists_follow_openssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    target = Target(alias="node-a", hostname="10.0.0.5", port=2222, user="alice")
    empty = tmp_path / "empty_config"
    empty.write_text("")
    files = host_key_files(target, [str(empty)])
    assert files.user == tuple(os.path.expanduser(p) for p in DEFAULT_USER_FILES)
    assert files.user[0] == f"{home}/.ssh/known_hosts" and files.system == DEFAULT_GLOBAL_FILES
    assert files.record_to == files.user[0] and not files.checking_off_in_config

    tokens = tmp_path / "tokens_config"
    tokens.write_text(
        "Host node-a\n  UserKnownHostsFile ~/kh/%n %d/kh/%h_%p_%r ${SITE}/kh\n"
        "  GlobalKnownHostsFile /site/%k\n"
    )
    monkeypatch.setenv("SITE", "/srv/site")
    files = host_key_files(target, [str(tokens)])
    assert files.user == (f"{home}/kh/node-a", f"{home}/kh/10.0.0.5_2222_alice", "/srv/site/kh")
    assert files.system == ("/site/node-a",)
    # The inventory's ssh.known_hosts is the one file, whatever the config says.
    assert host_key_files(target, [str(tokens)], "~/pinned").all == (f"{home}/pinned",)

    # No -F: ~/.ssh/config first, then the system config, whose GlobalKnownHostsFile applies when the
    # user's says nothing (sites set it there); the user's own setting wins.
    system = tmp_path / "system_ssh_config"
    system.write_text("Host *\n  GlobalKnownHostsFile /site/hosts\n  UserKnownHostsFile /site/user\n")
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host node-a\n  UserKnownHostsFile ~/mine\n")
    paths = config_paths(None, system_config=str(system))
    assert paths == [f"{home}/.ssh/config", str(system)]
    files = host_key_files(target, paths)
    assert files.user == (f"{home}/mine",) and files.system == ("/site/hosts",)
    assert config_paths(str(empty), system_config=str(system)) == [str(empty)]  # like ssh -F


# ------------------------------------------------------------------ each cause once, in ssh's order


def test_unknown_host_key_and_refused_auth_are_each_told_once(
    tmp_path: Path, cluster1: SshdCluster, home: Path
) -> None:
    """A real sshd: with no known-hosts file the host key is blamed (after the port answered as SSH),
    its advice said once; with the key known and the wrong client key, authentication is blamed,
    naming the key offered and how to install the right one, once."""
    node = cluster1.nodes[0]
    absent = tmp_path / "no-global-file"
    inv = _inventory(tmp_path, cluster1, [node], _alias_block(node, f"  GlobalKnownHostsFile {absent}\n"))
    done = mscon("check", inv, cwd=inv.parent, env=_env(home))
    assert done.code == 4, done.err
    (line,) = _lines_with(done.err, "unreachable:")
    assert "node1 (node1-alias): no known host keys yet" in line, line
    assert line.count("ssh-keyscan") == 1 and line.count("--accept-new-host-keys") == 1, line
    assert line.count(" -> ") == 0 and line.endswith("(via ssh)"), line  # the error's own advice only

    kh = tmp_path / "cluster_hosts"
    write_known_hosts(kh, [node])
    wrong = tmp_path / "wrong_key"  # a key sshd does not know, named by the inventory
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(wrong))
    wrong.chmod(0o600)
    config = _alias_block(node, f"  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile {absent}\n")
    inv = _inventory(tmp_path, cluster1, [node], config)
    doc = yaml.safe_load(inv.read_text())
    doc["nodes"][0]["identity_file"] = str(wrong)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {k: v for k, v in _env(home).items() if k != "SSH_AUTH_SOCK"}
    done = mscon("check", inv, cwd=inv.parent, env=env)
    assert done.code == 4, done.err
    (line,) = _lines_with(done.err, "unreachable:")
    assert f"node1 (node1-alias): authentication failed as {SSH_USER}" in line, line
    assert f"offered: {wrong})" in line and line.count("ssh-copy-id") == 1, line
    assert f"ssh-copy-id -i {wrong} -p {node.port} {SSH_USER}@{node.host}" in line, line
    assert line.count(" -> ") == 0 and "host key" not in line, line
