"""Paths stay inside their roots: the joins themselves, run folders, and fetching logs back."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from mscon.agent import layout
from mscon.console.config.inventory import NodeSpec, SshSpec
from mscon.console.config.safepath import UnsafePath, is_plain_name, label, remote_within, within
from mscon.console.transport.local import LocalTransport
from mscon.console.transport.ssh import SshOptions, SshTransport

ESCAPES = [
    "..",
    "../x",
    "../../x",
    "a/../../b",
    "/etc/passwd",
    "",
    ".",
    "a//b",
    "a/",
    "nul\0byte",
    "new\nline",
    "esc\x1b[2J",
    "del\x7f",
]


@pytest.mark.parametrize("part", ESCAPES)
def test_within_refuses_anything_that_could_leave_the_root(tmp_path: Path, part: str) -> None:
    with pytest.raises(ValueError):
        within(tmp_path, part)
    with pytest.raises(ValueError):
        within(tmp_path, "ok", part)
    with pytest.raises(ValueError):
        remote_within("/home/u/.cache/mscon", part)
    with pytest.raises(UnsafePath):  # the same error, under its own name
        remote_within("/home/u/.cache/mscon", "runs", part)


def test_within_joins_plain_names(tmp_path: Path) -> None:
    assert within(tmp_path, "a", "b.log") == tmp_path / "a" / "b.log"
    assert within(tmp_path, "attempt_0/r0.log") == tmp_path / "attempt_0" / "r0.log"
    assert within(tmp_path) == tmp_path
    assert (
        within(str(tmp_path), "..x", "x..", "a b", "'q'", 'd"q;')
        == tmp_path / "..x" / "x.." / "a b" / "'q'" / 'd"q;'
    )
    assert remote_within("/h/.cache/mscon", "runs", "r1", "node-1") == "/h/.cache/mscon/runs/r1/node-1"
    assert remote_within(".cache/mscon", "sync", "work-ab.tar.gz") == ".cache/mscon/sync/work-ab.tar.gz"


def test_errors_say_what_and_why() -> None:
    with pytest.raises(
        ValueError, match=r"node name '\.\./\.\./x' cannot be used as a file name: contains '/'"
    ):
        label("../../x", "node name")
    with pytest.raises(ValueError, match=r"would not stay inside '/r': '\.\.' is not a file name"):
        remote_within("/r", "a/..")
    with pytest.raises(ValueError, match="absolute path"):
        within("/r", "/abs")
    with pytest.raises(ValueError, match="NUL"):
        within("/r\0", "x")
    assert is_plain_name("r0.log") and not is_plain_name("a/b") and not is_plain_name("..")


def _local(name: str, home: Path) -> LocalTransport:
    t = LocalTransport(NodeSpec(name=name, host="localhost", devices=1, transport="local"))
    t.home = str(home)  # as connect() would, without touching the real home folder
    return t


def _ssh(name: str) -> SshTransport:
    inv = SimpleNamespace(ssh=SshSpec(known_hosts="/nonexistent/known_hosts"))
    node = NodeSpec(name=name, host="127.0.0.2", devices=1)
    return SshTransport(node, inv, SshOptions())  # type: ignore[arg-type]


def test_run_dir_checks_run_id_and_node_name(tmp_path: Path) -> None:
    t = _local("node-1", tmp_path)
    # where the agent looks for it too (relay, ls), with the cache folder the console names
    assert t.run_dir("r1") == layout.run_folder(t.cache_root, "r1", "node-1")
    assert t.cache_root == layout.cache_folder(str(tmp_path))
    for bad in ("../r", "", "a/b", "..", "x\ny"):
        with pytest.raises(ValueError, match="run id"):
            t.run_dir(bad)
    for transport in (_local("../../x", tmp_path), _ssh("../../x")):
        with pytest.raises(ValueError, match="node name"):
            transport.run_dir("r1")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_hostile_node_name_fetches_nothing(tmp_path: Path) -> None:
    """A node named ``../../x`` (built in Python: the loader refuses it) is refused before any write."""
    home, logs = tmp_path / "home", tmp_path / "a" / "b" / "logs"
    logs.mkdir(parents=True)
    run = Path(layout.run_folder(layout.cache_folder(str(home)), "r1", "x"))
    Path(layout.attempt_folder(run, 0)).mkdir(parents=True)
    Path(layout.log_path(run, 0, "r0")).write_text("hello\n")
    before = _tree(tmp_path)
    for transport in (_local("../../x", home), _ssh("../../x")):
        with pytest.raises(ValueError):
            transport.run_dir("r1")
        for kwargs in ({"logs_root": str(logs)}, {}):
            with pytest.raises(ValueError):
                await transport.fetch_run_dir(str(run), str(logs / "../../x"), **kwargs)
    assert _tree(tmp_path) == before  # nothing was written anywhere


async def test_local_fetch_stays_inside_the_logs_folder(tmp_path: Path) -> None:
    home, logs = tmp_path / "home", tmp_path / "logs"
    t = _local("node1", home)
    with pytest.raises(ValueError, match="would not stay inside"):
        await t.fetch_run_dir(t.run_dir("r1"), str(tmp_path / "elsewhere"), logs_root=str(logs))
    with pytest.raises(ValueError, match="is not a run folder"):
        await t.fetch_run_dir(str(tmp_path), str(logs / "node1"), logs_root=str(logs))
    assert not (tmp_path / "elsewhere").exists() and not logs.exists()


async def test_local_fetch_does_not_follow_links_out_of_the_run_dir(tmp_path: Path) -> None:
    home, logs = tmp_path / "home", tmp_path / "logs"
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy me\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_text("nor me\n")
    t = _local("node1", home)
    run = Path(t.run_dir("r1"))
    attempt = Path(layout.attempt_folder(run, 0))
    attempt.mkdir(parents=True)
    Path(layout.log_file(attempt, "r0")).write_text("step 1\n")
    (attempt / "leak.log").symlink_to(secret)
    (attempt / "dirlink").symlink_to(outside)
    (run / "escape").symlink_to(tmp_path)
    work = Path(layout.work_folder(str(run)))
    work.mkdir()
    (work / "train.py").write_text("synced, not a log\n")
    os.mkfifo(attempt / "pipe")  # would block a naive copy
    await t.fetch_run_dir(str(run), str(logs / "node1"), logs_root=str(logs))
    log = layout.log_path("", 0, "r0")  # relative to the run folder
    assert _tree(logs / "node1") == [layout.attempt_name(0), log]
    assert (logs / "node1" / log).read_text() == "step 1\n"
    # A missing run folder (the node never started) is not an error.
    await t.fetch_run_dir(t.run_dir("r2"), str(logs / "node1-r2"), logs_root=str(logs))
    assert not (logs / "node1-r2").exists()
