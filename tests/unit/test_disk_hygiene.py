"""Disk hygiene: checkpoints stay on the nodes unless asked (--fetch checkpoints), the workdir is
refused before packing when it is /, a home folder or too large, .gitignore and job.exclude keep
files out of the sync, and `mscon prune` removes old node and local run folders."""

from __future__ import annotations

import io
import json
import os
import secrets
import tarfile
from pathlib import Path

import pytest
from conftest import local_inventory, mscon, write_inventory
from mscon.agent import layout
from mscon.console.transport.bundle import workdir_archive
from mscon.console.transport.ignore import ignored, parse
from mscon.console.transport.workdir import WorkdirRefused, check_location, workdir_files

# A rank that saves a "checkpoint" where the trainer keeps them: the node run folder's checkpoints/.
SAVER = """\
import os, pathlib
if os.environ.get("MS_ROLE") != "MS_SCHED":
    run = pathlib.Path(os.environ["MSCON_METRICS"]).parent.parent
    (run / "checkpoints").mkdir(exist_ok=True)
    (run / "checkpoints" / "step1.ckpt").write_bytes(b"w" * 4096)
    print("saved a checkpoint")
"""


def _home(tmp_path: Path) -> dict[str, str]:
    """mscon's environment with a HOME of its own: a local node keeps its runs under it, so what
    these tests prune and look at is theirs alone."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(home)}


def _node_dir(env: dict[str, str], run_id: str) -> Path:
    return Path(layout.run_folder(layout.cache_folder(env["HOME"]), run_id, "local"))


def _saver_job(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "save.py").write_text(SAVER)
    return local_inventory(tmp_path / "inv.yaml", 1, "save.py", [], workdir=work)


@pytest.mark.parametrize("asked", [False, True])
def test_checkpoints_stay_on_the_node_unless_asked(tmp_path: Path, asked: bool) -> None:
    inv = _saver_job(tmp_path)
    run_id = f"ckpt-{secrets.token_hex(3)}"
    flags = ["--fetch", "checkpoints"] if asked else []
    logs = tmp_path / "logs"
    env = _home(tmp_path)
    done = mscon(
        "run",
        "--no-tui",
        "-q",
        "--no-check",
        inv,
        "--run-id",
        run_id,
        "--logs-dir",
        logs,
        *flags,
        cwd=tmp_path,
        env=env,
    )
    assert done.code == 0, done.err
    node = _node_dir(env, run_id)
    assert (node / layout.CHECKPOINT_DIR / "step1.ckpt").is_file()  # kept on the node either way
    fetched = logs / run_id / "local"
    assert (fetched / layout.attempt_name(0) / "r0.log").is_file()
    assert (fetched / layout.CHECKPOINT_DIR / "step1.ckpt").is_file() is asked
    summary = json.loads((logs / run_id / "summary.json").read_text())
    [record] = summary["fetched"]
    assert record["node"] == "local" and record["error"] is None and record["seconds"] >= 0
    assert (record["bytes"] >= 4096) is asked and record["bytes"] > 0
    assert "fetched in" in done.err


def test_fetch_takes_only_what_can_be_asked_for(tmp_path: Path) -> None:
    done = mscon("run", "--fetch", "everything", cwd=tmp_path)
    assert done.code == 2 and "invalid choice: 'everything'" in done.err and "Traceback" not in done.err


def _ssh_inventory(tmp_path: Path, workdir: Path, **job: object) -> Path:
    """One node nobody can reach: a refusal must come before any connection is tried."""
    (workdir / "train.py").exists() or (workdir / "train.py").write_text("print(1)\n")
    return write_inventory(
        tmp_path / "ssh.yaml",
        {
            "name": "unreachable",
            "device_target": "CPU",
            "nodes": [{"host": "192.0.2.1", "name": "n1", "devices": 1}],
            "job": {"workdir": str(workdir), "script": "train.py", **job},
            "ssh": {"connect_timeout_s": 30},
        },
    )


def test_a_workdir_over_the_limit_is_one_line_exit_2_before_connecting(tmp_path: Path) -> None:
    work = tmp_path / "big"
    work.mkdir()
    (work / "data.bin").write_bytes(b"\0" * 4096)
    inv = _ssh_inventory(tmp_path, work, max_workdir_gib=0.000001)  # about 1 KiB
    done = mscon("run", "--no-tui", inv, cwd=tmp_path, timeout=20)
    assert done.code == 2, done.err
    [line] = done.err.splitlines()
    assert "more than" in line and "job.max_workdir_gib" in line and "data.bin" in line
    # Kept out by a .gitignore, the same workdir goes (and then the node is unreachable: exit 4).
    (work / ".gitignore").write_text("*.bin\n")
    assert workdir_files(work, (), max_bytes=1024)


@pytest.mark.parametrize("where", ["root", "home", "above home"])
def test_root_or_a_home_folder_is_refused(tmp_path: Path, where: str) -> None:
    target = {"root": Path("/"), "home": Path.home(), "above home": Path.home().parent}[where]
    with pytest.raises(WorkdirRefused, match="would be copied to every node"):
        check_location(target)
    check_location(tmp_path)  # an ordinary folder is fine


def test_root_as_workdir_from_the_command_line(tmp_path: Path) -> None:
    inv = _ssh_inventory(tmp_path, tmp_path)
    done = mscon("run", "--no-tui", inv, "--workdir", "/", "--", "/etc/hostname", cwd=tmp_path, timeout=20)
    assert done.code == 2 and len(done.err.splitlines()) == 1, done.err


def test_gitignore_and_job_exclude_keep_files_out_of_the_archive(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text(
        "# outputs\n*.log\n/outputs/\ndata/**/*.npy\n!keep.log\nbuild\nsub/local.txt\n"
    )
    for rel in (
        "a.log",
        "keep.log",
        "outputs/model.ckpt",
        "pkg/outputs/ok.py",
        "data/x/y/z.npy",
        "data/readme.md",
        "build/lib.so",
        "pkg/build",
        "sub/local.txt",
        "sub/other.txt",
        "big/blob.bin",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / "pkg" / ".gitignore").write_text("*.tmp\n")
    (tmp_path / "pkg" / "w.tmp").write_text("t")
    archive = workdir_archive(tmp_path, ("big",))
    names = set(tarfile.open(fileobj=io.BytesIO(archive.data)).getnames())
    assert names == {
        ".gitignore",
        "train.py",
        "keep.log",
        "pkg/.gitignore",
        "pkg/outputs/ok.py",
        "data/readme.md",
        "sub/other.txt",
    }
    assert archive.files == len(names) and archive.size == len(archive.data)
    assert workdir_archive(tmp_path, ("big",)).digest == archive.digest  # streamed, still reproducible


def test_gitignore_subset_rules() -> None:
    rules = parse(["*.o", "!important.o", "doc/*.txt", "**/cache/", "a/**/b", "\\#hash", "/top"])
    assert ignored(rules, "x/y.o", False) and not ignored(rules, "x/important.o", False)
    assert ignored(rules, "doc/n.txt", False) and not ignored(rules, "doc/sub/n.txt", False)
    assert ignored(rules, "p/q/cache", True) and not ignored(rules, "p/q/cache", False)
    assert ignored(rules, "a/b", True) and ignored(rules, "a/x/y/b", False)
    assert (
        ignored(rules, "#hash", False) and ignored(rules, "top", False) and not ignored(rules, "x/top", False)
    )


def test_prune_over_the_local_transport(tmp_path: Path) -> None:
    """Three finished runs and a running one on the node, and their fetched copies: --keep 1
    removes the two older finished runs on the node and (with --local) here, never the running
    one. (The node's HOME may hold other runs: --keep counts them too, so only ours are checked.)"""
    inv = local_inventory(tmp_path / "inv.yaml", 1, "bench/fake_rank.py", ["--steps", "1", "--rate", "0"])
    tag = secrets.token_hex(3)
    logs = tmp_path / "logs"
    env = _home(tmp_path)
    ids = [f"p{i}-{tag}" for i in range(3)]
    for run_id in ids:
        done = mscon(
            "run",
            "--no-tui",
            "-q",
            "--no-check",
            inv,
            "--run-id",
            run_id,
            "--logs-dir",
            logs,
            cwd=tmp_path,
            env=env,
        )
        assert done.code == 0, done.err
    # A run that says it is running (an agent elsewhere, say), the oldest of all: never pruned.
    live = _node_dir(env, f"live-{tag}")
    live.mkdir(parents=True)
    (live / layout.STATE).write_text(json.dumps({"status": "running", "started": 1.0}))
    dry = mscon(
        "prune", inv, "--keep", "0", "--dry-run", "--local", "--logs-dir", logs, cwd=tmp_path, env=env
    )
    assert dry.code == 0, dry.err
    assert f"local: would remove {ids[1]}" in dry.out and f"live-{tag}" not in dry.out
    assert _node_dir(env, ids[0]).is_dir() and (logs / ids[0]).is_dir()
    done = mscon("prune", inv, "--keep", "1", "--local", "--logs-dir", logs, cwd=tmp_path, env=env)
    assert done.code == 0, done.err
    assert f"local: removed {ids[0]}" in done.out and f"local: removed {ids[1]}" in done.out
    assert "freed" in done.out.splitlines()[-1]
    assert not _node_dir(env, ids[0]).exists()
    assert not _node_dir(env, ids[1]).exists()
    assert _node_dir(env, ids[2]).is_dir() and live.is_dir()
    assert sorted(p.name for p in logs.iterdir()) == [ids[2]]
    bad = mscon("prune", inv, "--keep", "-1", cwd=tmp_path, env=env)
    assert bad.code == 2 and len(bad.err.splitlines()) == 1
