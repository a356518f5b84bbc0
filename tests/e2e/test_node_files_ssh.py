"""Node files are private over SSH (issue 33): what the SFTP upload makes on a node (the agent's
folders and files, ``sync/`` and the workdir archive) is 0700 and 0600 on a real sshd, whose SFTP
server's defaults make 0755 folders and 0644 files (sshd's umask is at least 022, never 077), in
a home that is 0755; a second local user reads none of it."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from mscon.agent import layout
from mscon.console.config.inventory import NodeSpec, SshSpec
from mscon.console.transport import SshOptions
from mscon.console.transport.bundle import AGENT_PACKAGE, agent_bundle, workdir_archive
from mscon.console.transport.ssh import SshTransport
from node_files import listing, loose
from second_user import intruder_uid, run_as
from sshd_nodes import require_sshd, start_sshd_cluster

pytestmark = pytest.mark.ssh


def _mode(path: Path) -> str:
    return f"{stat.S_IMODE(os.lstat(path).st_mode):04o}"


async def test_sftp_uploads_are_private(tmp_path: Path) -> None:
    require_sshd()
    cluster = start_sshd_cluster(tmp_path / "sshd", n=1)
    # A fresh home for the node user (0755, with a ~/.cache of 0755 as many tools leave it):
    # everything in its mscon folder is then this test's upload.
    home = Path(tempfile.mkdtemp(prefix="mscon-home-", dir="/tmp"))
    try:
        home.chmod(0o755)
        (home / ".cache").mkdir()
        (home / ".cache").chmod(0o755)
        work = tmp_path / "work"
        work.mkdir()
        (work / "train.py").write_text(f"print('the job, {secrets.token_hex(8)}')\n")
        n = cluster.nodes[0]
        node = NodeSpec(
            name="node1",
            host=n.host,
            devices=1,
            user="root",
            port=n.port,
            identity_file=str(cluster.client_key),
        )
        inv = SimpleNamespace(ssh=SshSpec(known_hosts=str(cluster.known_hosts), connect_timeout_s=5))
        transport = SshTransport(node, inv, SshOptions())  # type: ignore[arg-type]
        await transport.connect()
        try:
            transport.home = str(home)  # its mscon folder: in the fresh home
            bundle = agent_bundle()
            agent_dir = await transport.ensure_agent(bundle)
            archive = workdir_archive(work)
            remote = await transport.upload_workdir(archive)
        finally:
            await transport.close()
        cache = Path(layout.cache_folder(str(home)))
        uploaded = Path(remote)
        assert uploaded.parent == cache / layout.SYNC_DIR and uploaded.is_file()
        assert (Path(agent_dir) / AGENT_PACKAGE / ".complete").is_file()
        bad = loose(cache)
        assert not bad, "not private (want folders 0700, files 0600):\n" + "\n".join(bad)
        assert [_mode(cache), _mode(uploaded.parent), _mode(uploaded)] == ["0700", "0700", "0600"]
        uid = intruder_uid()
        if uid is not None:
            assert run_as(uid, "ls", str(home / ".cache")).returncode == 0  # it reaches that far
            for argv in (
                ("cat", str(uploaded)),
                ("cat", str(Path(agent_dir) / AGENT_PACKAGE / "main.py")),
                ("ls", str(cache)),
            ):
                got = run_as(uid, *argv)
                assert got.returncode != 0 and not got.stdout, (
                    f"{argv}: {got.stdout[:80]!r}\n{listing(cache)}"
                )
    finally:
        cluster.stop()
        shutil.rmtree(home, ignore_errors=True)
