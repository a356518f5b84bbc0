"""The fetch over SSH (issue 33): what the console copies back from a real sshd node is 0600 in
0700 folders whatever the console's umask (SFTP's own open follows it), never through a link.
The local and Slurm fetches and the recording: tests/unit/test_fetched_private.py."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from mscon.agent import layout
from mscon.console.config.inventory import NodeSpec, SshSpec
from mscon.console.transport import SshOptions
from mscon.console.transport.ssh import SshTransport
from node_files import not_private
from sshd_nodes import SshdCluster

pytestmark = pytest.mark.ssh


@pytest.fixture
def cluster(sshd_node: SshdCluster) -> SshdCluster:
    return sshd_node


def _transport(cluster: SshdCluster) -> SshTransport:
    n = cluster.nodes[0]
    node = NodeSpec(
        name="node1", host=n.host, devices=1, user="root", port=n.port, identity_file=str(cluster.client_key)
    )
    inv = SimpleNamespace(ssh=SshSpec(known_hosts=str(cluster.known_hosts), connect_timeout_s=5))
    return SshTransport(node, inv, SshOptions())  # type: ignore[arg-type]


async def test_an_ssh_fetch_is_private_under_any_umask(tmp_path: Path, cluster: SshdCluster) -> None:
    t = _transport(cluster)
    await t.connect()
    run = Path(t.run_dir(f"private-{secrets.token_hex(4)}"))  # the sshd node is this machine
    old = os.umask(0)
    try:
        attempt = Path(layout.attempt_folder(run, 0))
        ckpt = Path(layout.checkpoint_folder(str(run))) / "rank_0"
        for folder in (attempt, ckpt):
            folder.mkdir(parents=True, mode=0o777)
        for path in (layout.log_file(attempt, "r0"), layout.journal_file(str(run)), ckpt / "step_3.ckpt"):
            Path(path).write_text("node bytes\n")
            os.chmod(path, 0o666)
        logs = tmp_path / "mscon-runs" / "r1"
        logs.mkdir(parents=True, mode=0o755)  # the run folder, as made under another umask
        victim = tmp_path / "victim.txt"
        victim.write_text("not the node's\n")
        (logs / "node1").mkdir(mode=0o777)
        (logs / "node1" / layout.JOURNAL).symlink_to(victim)  # a link where the journal goes
        got = await t.fetch_run_dir(
            str(run), str(logs / "node1"), logs_root=str(logs), include=(layout.CHECKPOINT_DIR,)
        )
        assert got == 3 * len("node bytes\n")
        assert victim.read_text() == "not the node's\n"
        assert (logs / "node1" / layout.JOURNAL).read_text() == "node bytes\n"
        assert (logs / "node1" / layout.CHECKPOINT_DIR / "rank_0" / "step_3.ckpt").is_file()
        assert not_private(logs) == []
    finally:
        os.umask(old)
        await t.close()
        shutil.rmtree(run.parent, ignore_errors=True)
