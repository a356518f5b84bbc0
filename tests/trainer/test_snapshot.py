"""In-memory snapshots (trainer/snapshot.py): atomic writes, damaged files skipped, the resume step
agreed between snapshots and checkpoints, and the trainer back at the step after a kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import TRAINER, local_inventory, mscon, needs_mindspore, write_inventory
from mscon.agent import layout
from mscon.trainer import snapshot


class _Param:
    """What ``take`` reads of a MindSpore Parameter: asnumpy(), sharing its memory as on CPU."""

    def __init__(self, name: str, data: np.ndarray) -> None:
        self.name, self.data = name, data

    def asnumpy(self) -> np.ndarray:
        return self.data


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc1.weight": rng.standard_normal((8, 4)).astype(np.float32), "moment.fc1": np.arange(3.0)}


def test_write_read_round_trip_and_keeps_the_newest_two(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        snapshot.write(str(tmp_path), 0, step, _arrays(step), {"epoch": 1})
    assert snapshot.steps(str(tmp_path), 0) == [2, 3]
    snap = snapshot.read(str(tmp_path), 0, 3)
    assert snap is not None and snap.step == 3 and snap.meta["epoch"] == 1
    for name, want in _arrays(3).items():
        np.testing.assert_array_equal(snap.arrays[name], want)


def test_a_write_killed_midway_leaves_no_snapshot(tmp_path: Path) -> None:
    snapshot.write(str(tmp_path), 0, 4, _arrays(4), {})
    # What a kill during np.savez leaves: the temp file, half written, never renamed.
    full = Path(snapshot.path(str(tmp_path), 0, 4)).read_bytes()
    (Path(snapshot.rank_dir(str(tmp_path), 0)) / ".snap_5.123.tmp").write_bytes(full[: len(full) // 2])
    assert snapshot.steps(str(tmp_path), 0) == [4]
    assert [s.step for s in snapshot.newest_valid([str(tmp_path)], 0)] == [4]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_snapshot_is_skipped_for_the_older_one(tmp_path: Path, damage: str) -> None:
    for step in (6, 7):
        snapshot.write(str(tmp_path), 0, step, _arrays(step), {})
    newest = Path(snapshot.path(str(tmp_path), 0, 7))
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 100]
    else:  # a bit flipped inside the weights: the zip member's CRC no longer matches
        data[200] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert snapshot.read(str(tmp_path), 0, 7) is None
    assert [s.step for s in snapshot.newest_valid([str(tmp_path)], 0)] == [6]


def test_the_copy_is_taken_at_submit_not_when_written(tmp_path: Path) -> None:
    weight = np.zeros(4, dtype=np.float32)
    writer = snapshot.Writer(str(tmp_path), 0)
    writer.submit(1, [("w", _Param("w", weight))], {})
    weight += 5.0  # the next step updates the parameter in place while the write may still run
    writer.wait()
    snap = snapshot.read(str(tmp_path), 0, 1)
    assert snap is not None
    np.testing.assert_array_equal(snap.arrays["w"], np.zeros(4, dtype=np.float32))
    assert writer.error is None and writer.count == 1


def test_a_failing_write_is_recorded_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = snapshot.Writer(str(blocker), 0)  # its rank folder cannot be made under a file
    writer.submit(1, [("w", _Param("w", np.zeros(2)))], {})
    writer.wait()
    assert isinstance(writer.error, OSError)


def test_snapshots_go_to_shm_when_it_has_room_else_beside_the_checkpoints(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    dirs = snapshot.candidate_dirs(None, str(tmp_path / "ck"), shm=str(shm))
    assert dirs[0].startswith(str(shm) + os.sep) and dirs[1] == str(tmp_path / "ck" / "snapshots")
    assert snapshot.choose_dir(dirs, 1024, shm=str(shm)) == dirs[0]
    assert snapshot.choose_dir(dirs, 1 << 60, shm=str(shm)) == dirs[1]
    assert snapshot.candidate_dirs("/x", str(tmp_path / "ck")) == ["/x"]
    assert snapshot.candidate_dirs(None, None) == []


def _checkpoint_marker(root: Path, step: int) -> None:
    """A complete checkpoint as checkpoint.complete_steps sees it (the file and its marker)."""
    folder = root / "rank_0"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"step_{step}.ckpt").write_bytes(b"")
    (folder / f"step_{step}.ckpt.done").write_text("{}")


def test_agree_takes_the_newer_of_snapshot_and_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    _checkpoint_marker(ck, 10)
    assert snapshot.agree(str(ck), 0, 1, 10, 40, [12, 11]) == (12, True)
    _checkpoint_marker(ck, 20)
    assert snapshot.agree(str(ck), 0, 1, 10, 40, [12, 11]) == (20, False)
    assert snapshot.agree(str(ck), 0, 1, 10, 40, []) == (20, False)
    assert snapshot.agree(None, 0, 1, 10, 40, [5000]) == (5000, True)  # beyond float32's 2**24 halves


# ---------------------------------------------------------------- the trainer with real MindSpore


def _train(args: list[str], cwd: Path, attempt: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "RANK_", "MSCON_"))}
    env["MSCON_ATTEMPT"] = str(attempt)
    return subprocess.run(
        [sys.executable, str(TRAINER), *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
    )


def _last_loss(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("epoch:")][-1]


@pytest.mark.mindspore
@needs_mindspore
def test_resumes_at_the_step_after_the_kill_and_ends_like_an_uninterrupted_run(tmp_path: Path) -> None:
    common = ["--epochs", "2", "--steps-per-epoch", "6", "--snapshot-every", "1"]
    snaps = ["--checkpoint-dir", str(tmp_path / "ck"), "--snapshot-dir", str(tmp_path / "snap")]
    alone = ["--checkpoint-dir", str(tmp_path / "ck0"), "--snapshot-dir", str(tmp_path / "s0")]
    fresh = _train([*common, *alone], tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    killed = _train([*common, *snaps, "--die-at-step", "8"], tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (tmp_path / "ck" / "rank_0").exists()  # no checkpoint yet (every 10): only snapshots
    resumed = _train([*common, *snaps, "--resume"], tmp_path, attempt=1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "mscon-trainer: resumed from step 8 (snapshot saved" in resumed.stdout
    first = [line for line in resumed.stdout.splitlines() if line.startswith("epoch:")][0]
    assert first.startswith("epoch: 2 step: 3,")  # step 9: the one after the last completed one
    assert _last_loss(resumed.stdout) == _last_loss(fresh.stdout)  # same parameters at the end
    assert not (tmp_path / "snap" / "rank_0").exists()  # finished: the memory is given back


@pytest.mark.mindspore
@needs_mindspore
def test_damaged_snapshots_fall_back_to_the_checkpoint(tmp_path: Path) -> None:
    args = ["--epochs", "1", "--steps-per-epoch", "14", "--snapshot-every", "1", "--checkpoint-every", "10"]
    args += ["--checkpoint-dir", str(tmp_path / "ck"), "--snapshot-dir", str(tmp_path / "snap")]
    killed = _train([*args, "--die-at-step", "12"], tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    kept = sorted((tmp_path / "snap" / "rank_0").glob("snap_*.npz"))
    assert [p.name for p in kept] == ["snap_11.npz", "snap_12.npz"]
    for p in kept:
        p.write_bytes(p.read_bytes()[:-64])  # both cut short
    resumed = _train([*args, "--resume"], tmp_path, attempt=1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "mscon-trainer: resumed from step 10 (checkpoint saved" in resumed.stdout
    assert "snapshot of step 12 (rank 0) unreadable" in resumed.stdout


@pytest.mark.mindspore
@needs_mindspore
def test_two_ranks_restarted_by_mscon_resume_at_the_last_step(tmp_path: Path) -> None:
    """The console's restart path: it adds --checkpoint-dir and --resume; the snapshots default to
    /dev/shm. Rank 1 dies after step 10 with no checkpoint there (every 8): the next attempt starts
    at step 11 on every rank, and the replicas still agree."""
    args = ["--epochs", "1", "--steps-per-epoch", "14", "--batch-size", "16", "--checkpoint-every", "8"]
    args += ["--snapshot-every", "1", "--checksum-every", "1", "--die-at-step", "10", "--die-rank", "1"]
    inv = local_inventory(tmp_path / "inv.yaml", 2, "trainer/train.py", args)
    doc = yaml.safe_load(inv.read_text())
    write_inventory(inv, {**doc, "restart": {"max_restarts": 1, "backoff_s": 0}})
    done = mscon("run", "--no-tui", "-q", inv, "--json", tmp_path / "s.json", cwd=tmp_path, timeout=400)
    assert done.code == 0, done.err[-3000:]
    resumed = [line for line in done.out.splitlines() if "resumed from" in line or "kills itself" in line]
    assert "[local r0] mscon-trainer: resumed from step 10 (snapshot saved" in done.out, resumed
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["divergent_ranks"] == []
    logs = Path(summary["logs_dir"]) / "local"
    before, after = [], []
    for rank in (0, 1):
        for attempt, into in ((0, before), (1, after)):
            path = Path(layout.metrics_path(logs, attempt, f"r{rank}"))
            into.append([r for r in map(json.loads, path.read_text().splitlines()) if "step" in r])
    assert [recs[0]["step"] for recs in after] == [11, 11]
    assert [recs[-1]["step"] for recs in after] == [14, 14]
    pre_fault = {recs[-1]["param_checksum"] for recs in before if recs[-1]["step"] == 10}
    assert len(pre_fault) == 1  # the replicas agreed at the fault


def test_the_agent_removes_the_folder_the_trainer_writes_by_default(tmp_path: Path) -> None:
    """agent/layout.shm_snapshot_folder names the trainer's default /dev/shm folder (two packages,
    one rule: this holds them equal), which the agent removes as the run ends on the node."""
    run_dir = str(tmp_path / "runs" / "r1" / "node1")
    shm_default = snapshot.candidate_dirs(None, layout.checkpoint_folder(run_dir))[0]
    assert layout.shm_snapshot_folder(run_dir) == shm_default


def test_budget_interval_keeps_the_copy_under_its_share_of_the_step() -> None:
    assert snapshot.budget_interval(0.0001, 0.1, 0.02) == 1  # 0.1 ms copy, 100 ms step: every step
    assert snapshot.budget_interval(0.14e-3, 1.78e-3, 0.02) == 4  # the toy MLP on CPU: 7.9 % a step
    assert snapshot.budget_interval(2.0, 1.0, 0.02) == 100
    assert snapshot.budget_interval(0.0, 1.0, 0.02) == 1 and snapshot.budget_interval(1.0, 0.0, 0.02) == 1


def test_an_auto_interval_snapshots_every_step_until_it_is_agreed() -> None:
    fixed = snapshot.Interval(3, 0.02)
    assert [s for s in range(1, 10) if fixed.due(s)] == [3, 6, 9]
    assert fixed.observe(1.0, 0.5, 0, 1) is None  # a fixed interval is never re-decided
    auto = snapshot.Interval("auto", 0.02)
    decided = []
    for step in range(1, 12):
        assert auto.due(step) == (not decided or step % decided[0] == 0)
        got = auto.observe(5.0 if step == 1 else 0.01, 0.001, 0, 1)  # the first step compiles
        if got is not None:
            decided.append(got)
    assert decided == [5]  # 1 ms copy / (2 % of 10 ms), decided once, after the probe steps
    assert snapshot.Interval(0, 0.02).due(4) is False


@pytest.mark.mindspore
@needs_mindspore
def test_auto_interval_in_the_trainer(tmp_path: Path) -> None:
    args = [
        "--epochs",
        "1",
        "--steps-per-epoch",
        "16",
        "--snapshot-every",
        "auto",
        "--snapshot-budget",
        "0.5",
    ]
    args += ["--checkpoint-dir", str(tmp_path / "ck"), "--snapshot-dir", str(tmp_path / "snap")]
    done = _train(args, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if "(auto)" in line]
    assert len(said) == 1 and said[0].startswith("mscon-trainer: a snapshot every ")
    semi = ["--device-target", "GPU", "--parallel-mode", "semi_auto_parallel", "--snapshot-every", "auto"]
    bad = _train(semi, tmp_path)
    assert bad.returncode == 2 and "--snapshot-every auto works with data_parallel" in bad.stderr
