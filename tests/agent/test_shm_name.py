"""The ranks' /dev/shm snapshot folder is named by an HMAC under the run's key (issue 45, a low):
another user on the node, who can work out the run's path (its run id and node name), cannot
take the name and its seven alternates first and push the snapshots onto disk."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from mscon.agent import layout
from mscon.agent import procs as procmod
from mscon.agent.protocol import ProcSpec

from mscon_resume import env as resume_env
from mscon_resume import store

SPEC = ProcSpec("r0", 0, 0, ("python3", "train.py"), {"MS_ROLE": "MS_WORKER"})


def _guessed(run_dir: str) -> list[str]:
    """What another user can work out from the path alone: the unkeyed digest and its alternates."""
    path = os.path.abspath(layout.checkpoint_folder(run_dir)).encode()
    return store.alternates("/dev/shm/mscon-" + hashlib.sha256(path).hexdigest()[:16])


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[str]:
    folder = tmp_path / "runs" / "slurm-4242" / "node1"
    folder.mkdir(parents=True)
    yield str(folder)
    for path in _guessed(str(folder)) + store.alternates(layout.shm_snapshot_folder(str(folder))):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def test_the_shm_folder_cannot_be_named_from_the_runs_path(
    run_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    env = procmod.process_env(SPEC, layout.attempt_folder(run_dir, 0), {})  # makes the run's key
    guessed = _guessed(run_dir)
    # Another user took every name they can work out (here: this user's folders, as good a block).
    for path in guessed:
        os.mkdir(path, 0o700)
    ours = layout.shm_snapshot_folder(run_dir)
    assert ours not in guessed and not ours.startswith(guessed[0])
    # The ranks name it alike (MSCON_SNAPSHOT_KEY, MSCON_STATE_DIR: core.Resumer's roots) and get it.
    monkeypatch.setenv("MSCON_SNAPSHOT_KEY", env["MSCON_SNAPSHOT_KEY"])
    monkeypatch.setenv("MSCON_STATE_DIR", env["MSCON_STATE_DIR"])
    roots = store.candidate_dirs(resume_env.state_dir(None), key=resume_env.snapshot_key())
    assert roots[0] == ours
    assert store.make_private(roots[0]) == ours
    # Another run's key names another folder for the same path.
    other = layout.shm_snapshot_folder(run_dir)
    os.remove(layout.resume_key_file(run_dir))
    procmod.run_key(run_dir)
    assert layout.shm_snapshot_folder(run_dir) != other
    shutil.rmtree(ours, ignore_errors=True)


def test_a_run_without_a_key_keeps_the_plain_digest(run_dir: str) -> None:
    """The library on its own (no MSCON_SNAPSHOT_KEY) and the agent of a run whose ranks got none
    name the same folder."""
    assert layout.shm_snapshot_folder(run_dir) == _guessed(run_dir)[0]
    assert store.shm_folder(layout.checkpoint_folder(run_dir)) == _guessed(run_dir)[0]
