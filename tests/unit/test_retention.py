"""Node run folders pruned by retention (agent/retention.py): keep the newest N, never a running or
detached run, --older-than, dry run; over real temporary folders laid out as agent/layout.py says."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from conftest import wait_for
from mscon.agent import layout, retention
from mscon.agent.journal import RunStatus

NODE = "n1"
NOW = 1_700_000_000.0
DAY = 86400.0


def _run(root: Path, run_id: str, started: float, status: str = RunStatus.SUCCEEDED, **extra: object) -> Path:
    folder = root / run_id / NODE
    (folder / layout.attempt_name(0)).mkdir(parents=True)
    (folder / layout.attempt_name(0) / "r0.log").write_text("x" * 100)
    state = {"run_id": run_id, "node": NODE, "status": status, "started": started, **extra}
    (folder / layout.STATE).write_text(json.dumps(state))
    return folder


def _ids(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def test_keeps_the_newest_n_and_reports_the_bytes_freed(tmp_path: Path) -> None:
    for i in range(5):
        _run(tmp_path, f"run{i}", NOW - (5 - i) * 60)
    (tmp_path / "run0" / NODE / "checkpoints").mkdir()
    (tmp_path / "run0" / NODE / "checkpoints" / "a.ckpt").write_bytes(b"\0" * 4096)
    removed = retention.prune(str(tmp_path), NODE, keep=2, now=NOW)
    assert sorted(r[0] for r in removed) == ["run0", "run1", "run2"]
    sizes = dict((r[0], r[1]) for r in removed)
    assert sizes["run0"] > 4096 and sizes["run1"] > 100
    assert all(r[2] == "" for r in removed)
    assert _ids(tmp_path) == {"run3", "run4"}  # the run id folders went too, and no trash is left


def test_never_removes_a_running_or_detached_run(tmp_path: Path) -> None:
    _run(tmp_path, "old-running", NOW - 10 * DAY, RunStatus.RUNNING)
    _run(tmp_path, "old-detached", NOW - 9 * DAY, RunStatus.SUCCEEDED, detached=True)
    _run(tmp_path, "old-done", NOW - 8 * DAY)
    _run(tmp_path, "new", NOW - 60)
    removed = retention.prune(str(tmp_path), NODE, keep=0, now=NOW)
    assert [r[0] for r in removed] == ["new", "old-done"]
    assert _ids(tmp_path) == {"old-running", "old-detached"}


def test_protected_runs_count_towards_the_kept_ones(tmp_path: Path) -> None:
    _run(tmp_path, "a", NOW - 300)
    _run(tmp_path, "b", NOW - 200, RunStatus.RUNNING)
    _run(tmp_path, "c", NOW - 100)
    assert [r[0] for r in retention.prune(str(tmp_path), NODE, keep=2, now=NOW)] == ["a"]


def test_older_than_only_removes_runs_that_old(tmp_path: Path) -> None:
    _run(tmp_path, "ancient", NOW - 30 * DAY)
    _run(tmp_path, "week", NOW - 6 * DAY)
    _run(tmp_path, "today", NOW - 3600)
    removed = retention.prune(str(tmp_path), NODE, keep=0, older_than_days=7, now=NOW)
    assert [r[0] for r in removed] == ["ancient"]
    assert _ids(tmp_path) == {"week", "today"}


def test_dry_run_names_what_would_go_and_removes_nothing(tmp_path: Path) -> None:
    for i in range(3):
        _run(tmp_path, f"run{i}", NOW - (3 - i) * 60)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    removed = retention.prune(str(tmp_path), NODE, keep=1, dry_run=True, now=NOW)
    assert sorted(r[0] for r in removed) == ["run0", "run1"]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_other_nodes_folders_and_the_skipped_run_stay(tmp_path: Path) -> None:
    """Several nodes may share one home: a node prunes its own folders only; the run starting now
    (skip) never goes; a folder with no state yet is a run being created, unless long left alone."""
    _run(tmp_path, "old", NOW - DAY)
    (tmp_path / "old" / "n2").mkdir()
    _run(tmp_path, "starting", NOW - 2 * DAY)
    fresh = tmp_path / "fresh" / NODE
    fresh.mkdir(parents=True)
    stale = tmp_path / "stale" / NODE
    stale.mkdir(parents=True)
    os.utime(stale, (NOW - 2 * DAY, NOW - 2 * DAY))
    os.utime(fresh, (NOW - 60, NOW - 60))
    removed = retention.prune(str(tmp_path), NODE, keep=0, skip=("starting",), now=NOW)
    assert sorted(r[0] for r in removed) == ["old", "stale"]
    assert (tmp_path / "old" / "n2").is_dir() and not (tmp_path / "old" / NODE).exists()
    assert (tmp_path / "starting" / NODE).is_dir() and fresh.is_dir()


def test_links_are_never_followed_or_removed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    root = tmp_path / "runs"
    _run(root, "a", NOW - DAY)
    (root / "a" / NODE / "escape").symlink_to(outside)
    (root / "linked").mkdir()
    (root / "linked" / NODE).symlink_to(outside)
    removed = retention.prune(str(root), NODE, keep=0, now=NOW)
    assert [r[0] for r in removed] == ["a"]
    assert (outside / "keep.txt").read_text() == "mine" and (root / "linked" / NODE).is_symlink()


def test_leftovers_of_an_interrupted_prune_are_swept(tmp_path: Path) -> None:
    trash = tmp_path / f"{retention.TRASH_PREFIX}abc"
    (trash / "attempt_0").mkdir(parents=True)
    _run(tmp_path, "a", NOW)
    assert retention.prune(str(tmp_path), NODE, keep=5, now=NOW) == []
    assert _ids(tmp_path) == {"a"}


def test_prune_at_start_keeps_the_starting_run_and_never_raises(tmp_path: Path) -> None:
    root = tmp_path / layout.RUNS_DIR
    for i in range(4):
        _run(root, f"run{i}", NOW - (10 - i) * DAY)
    starting = layout.run_folder(str(tmp_path), "new", NODE)
    os.makedirs(starting)
    retention.prune_at_start(starting, NODE, keep=2)
    assert _ids(root) == {"run2", "run3", "new"}
    retention.prune_at_start(str(tmp_path / "missing" / "x" / NODE), NODE, keep=0)  # nothing there: quiet


def _shm(run_folder: Path) -> Path:
    """The run's state copies in node memory, as the trainer writes them by default."""
    folder = Path(layout.shm_snapshot_folder(str(run_folder)))
    (folder / "rank_0").mkdir(parents=True)
    (folder / "rank_0" / "snap_7.npz").write_bytes(b"\0" * 64)
    return folder


def test_the_memory_of_runs_that_are_over_is_released_and_of_live_ones_kept(tmp_path: Path) -> None:
    """A killed agent never removed its /dev/shm copies: the next run on the node does, for runs
    ended or lost, never for one whose agent is alive, a detached one, or the starting one."""
    import subprocess
    import sys

    root = tmp_path / layout.RUNS_DIR
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that was an agent's and is gone
    runs = {
        "ended": _run(root, "ended", NOW - 300),
        "lost": _run(root, "lost", NOW - 200, RunStatus.RUNNING, pid=dead.pid),
        "live": _run(root, "live", NOW - 100, RunStatus.RUNNING, pid=os.getpid()),
        "detached": _run(root, "detached", NOW - 90, RunStatus.RUNNING, detached=True, pid=dead.pid),
        "new": _run(root, "new", NOW, RunStatus.RUNNING, pid=dead.pid),
    }
    shm = {k: _shm(v) for k, v in runs.items()}
    try:
        retention.prune_at_start(str(runs["new"]), NODE, keep=20)
        assert {k for k, f in shm.items() if f.exists()} == {"live", "detached", "new"}
        assert _ids(root) == set(runs)  # the run folders stay: only the memory went
    finally:
        for f in shm.values():
            shutil.rmtree(f, ignore_errors=True)


def test_a_pruned_runs_memory_goes_with_its_folder(tmp_path: Path) -> None:
    folder = _run(tmp_path, "old", NOW - 10 * DAY)
    shm = _shm(folder)
    try:
        assert [r[0] for r in retention.prune(str(tmp_path), NODE, keep=0, now=NOW)] == ["old"]
        assert not shm.exists()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_choose_is_pure_over_candidates() -> None:
    c = [retention.Candidate(f"r{i}", NOW - i * DAY, i == 3, f"/x/r{i}") for i in range(6)]
    assert [x.key for x in retention.choose(c, keep=2, now=NOW)] == ["r2", "r4", "r5"]
    assert [x.key for x in retention.choose(c, keep=0, older_than_s=4.5 * DAY, now=NOW)] == ["r5"]
    assert retention.choose(c, keep=10, now=NOW) == []


def test_the_agent_prunes_its_nodes_old_runs_as_a_run_starts(tmp_path: Path) -> None:
    """The agent, given a Start whose run folder is under the runs root, removes that node's runs
    beyond Start.keep_runs (off its loop's thread) and starts the ranks meanwhile."""
    import subprocess
    import sys
    import time

    from mscon.agent import protocol as P

    root = tmp_path / layout.RUNS_DIR
    for i in range(3):
        _run(root, f"old{i}", time.time() - (10 - i) * DAY)
    run_dir = layout.run_folder(str(tmp_path), "new", NODE)
    os.makedirs(run_dir)
    start = P.Start(
        run_id="new",
        node=NODE,
        attempt=0,
        run_dir=run_dir,
        cwd=str(tmp_path),
        procs=(P.ProcSpec(name="r0", rank=0, local_rank=0, argv=(sys.executable, "-c", "print(1)"), env={}),),
        grace_s=2.0,
        keep_runs=1,
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "mscon.agent", "--node", NODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert agent.stdin is not None
        agent.stdin.write(P.encode(start).encode())
        agent.stdin.flush()
        wait_for(lambda: _ids(root) == {"old2", "new"}, 30, "the run folders old2 and new only")
    finally:
        agent.kill()
        agent.wait()
