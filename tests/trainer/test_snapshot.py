"""The reference trainer's snapshots (mscon_resume, as trainer/train.py uses it) with real MindSpore:
back at the step after a kill, damaged snapshots falling back to the checkpoint, two ranks restarted
by mscon, the auto interval; and the agent's name for the trainer's /dev/shm folder. The library's
own unit tests (store, agreement, interval, security): tests/unit/test_resume_store.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TRAINER, local_inventory, mscon, needs_mindspore, write_inventory
from mscon.agent import layout

from mscon_resume import store

# ---------------------------------------------------------------- the trainer with real MindSpore


def _train(args: list[str], cwd: Path, attempt: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "RANK_", "MSCON_"))}
    env["MSCON_ATTEMPT"] = str(attempt)
    return subprocess.run(
        [sys.executable, str(TRAINER), *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
    )


def _last_loss(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("epoch:")][-1]


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
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


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
@needs_mindspore
def test_damaged_snapshots_fall_back_to_the_checkpoint(tmp_path: Path) -> None:
    args = ["--epochs", "1", "--steps-per-epoch", "14", "--snapshot-every", "1", "--checkpoint-every", "10"]
    args += ["--checkpoint-dir", str(tmp_path / "ck"), "--snapshot-dir", str(tmp_path / "snap")]
    killed = _train([*args, "--die-at-step", "12"], tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    kept = sorted((tmp_path / "snap" / "rank_0").glob("snap_*.msnap"))
    assert [p.name for p in kept] == ["snap_11.msnap", "snap_12.msnap"]
    for p in kept:
        p.write_bytes(p.read_bytes()[:-64])  # both cut short
    resumed = _train([*args, "--resume"], tmp_path, attempt=1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "mscon-trainer: resumed from step 10 (checkpoint saved" in resumed.stdout
    assert "snapshot of step 12 (rank 0) skipped: its MAC does not match" in resumed.stdout


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
    """agent/layout.shm_snapshot_folder names the ranks' default /dev/shm folder, that of the run's
    checkpoint folder (MSCON_STATE_DIR, agent/procs.py), as mscon_resume/store.shm_folder does
    (two packages, one rule: this holds them equal); the agent removes it as the run ends there."""
    run_dir = str(tmp_path / "runs" / "r1" / "node1")
    state_dir = layout.checkpoint_folder(run_dir)
    assert layout.shm_snapshot_folder(run_dir) == store.shm_folder(state_dir)
    assert layout.shm_snapshot_folder(run_dir) == store.candidate_dirs(state_dir)[0]
    assert layout._SHM_ALTERNATES == store._ALTERNATES  # and the names it may take instead


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
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
