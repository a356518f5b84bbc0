"""What the agent hands every rank for mscon_resume (agent/procs.py ``library_env``): the run's
state folder, the run's snapshot key, the shipped library first on PYTHONPATH; and which of a
run's /dev/shm snapshot folders the agent may remove (agent/layout.py)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from mscon.agent import layout
from mscon.agent import procs as procmod
from mscon.agent.protocol import ProcSpec

import mscon_resume
from mscon_resume import env as resume_env
from mscon_resume import store

SPEC = ProcSpec("r0", 0, 0, ("python3", "train.py"), {"MS_ROLE": "MS_WORKER"})
NOBODY = 65534


def _run_dir(tmp_path: Path, name: str = "node1") -> str:
    run_dir = tmp_path / "runs" / "run-1" / name
    run_dir.mkdir(parents=True)
    return str(run_dir)


def _env(run_dir: str, base: dict[str, str] | None = None) -> dict[str, str]:
    return procmod.process_env(SPEC, layout.attempt_folder(run_dir, 0), dict(base or {}))


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The agent running from an installed mscon: no shipped library beside it."""
    monkeypatch.setattr(procmod, "_RANK_LIBRARY", str(tmp_path / "not-shipped"))


def test_ranks_get_the_runs_state_folder_and_key(tmp_path: Path, no_library: None) -> None:
    old = os.umask(0)  # the key is private whatever the agent's umask
    try:
        run_dir = _run_dir(tmp_path)
        env = _env(run_dir, {"PYTHONPATH": "/theirs"})
    finally:
        os.umask(old)
    assert env["MSCON_STATE_DIR"] == layout.checkpoint_folder(run_dir)
    assert env["MSCON_METRICS"] == layout.metrics_path(run_dir, 0, "r0")
    key = env["MSCON_SNAPSHOT_KEY"]
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    key_file = Path(run_dir) / "resume.key"
    assert layout.resume_key_file(run_dir) == str(key_file)
    st = key_file.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert sorted(os.listdir(run_dir)) == ["resume.key"]  # no temp file left
    # Every rank of every attempt: the same key; another run (or node): another key.
    assert _env(run_dir)["MSCON_SNAPSHOT_KEY"] == key
    later = procmod.process_env(SPEC, layout.attempt_folder(run_dir, 3), {})
    assert later["MSCON_SNAPSHOT_KEY"] == key
    assert _env(_run_dir(tmp_path, "node2"))["MSCON_SNAPSHOT_KEY"] != key
    # What the library makes of it: 32 bytes, the state folder the agent frees in /dev/shm.
    os.environ.update(MSCON_SNAPSHOT_KEY=key, MSCON_STATE_DIR=env["MSCON_STATE_DIR"])
    try:
        assert resume_env.snapshot_key() == bytes.fromhex(key) and len(bytes.fromhex(key)) == 32
        found = store.candidate_dirs(resume_env.state_dir(None), key=resume_env.snapshot_key())[0]
        assert found == layout.shm_snapshot_folder(run_dir)  # keyed alike (core.Resumer's roots)
    finally:
        del os.environ["MSCON_SNAPSHOT_KEY"], os.environ["MSCON_STATE_DIR"]
    assert env["PYTHONPATH"] == "/theirs"  # no shipped library: the installed one serves


def test_concurrent_ranks_read_one_key(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    barrier = threading.Barrier(8)
    keys: list[str] = []

    def call() -> None:
        barrier.wait()
        keys.append(procmod.run_key(run_dir))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert sorted(os.listdir(run_dir)) == ["resume.key"]


def test_without_a_run_folder_no_key_is_set(tmp_path: Path, no_library: None) -> None:
    """The key cannot be made: the library then keys its own private folder."""
    run_dir = str(tmp_path / "missing")
    env = _env(run_dir)
    assert "MSCON_SNAPSHOT_KEY" not in env and env["MSCON_STATE_DIR"] == layout.checkpoint_folder(run_dir)


def test_the_shipped_library_goes_first_on_the_ranks_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What console/transport/bundle.py ships beside the agent: rank/mscon_resume/<FILES>.
    shipped = tmp_path / "agent" / layout.RANK_LIBRARY_DIR
    (shipped / "mscon_resume").mkdir(parents=True)
    src = Path(mscon_resume.__file__).parent
    for name in mscon_resume.FILES:
        shutil.copy(src / name, shipped / "mscon_resume" / name)
    monkeypatch.setattr(procmod, "_RANK_LIBRARY", str(shipped))
    run_dir = _run_dir(tmp_path)
    assert _env(run_dir)["PYTHONPATH"] == str(shipped)
    env = _env(run_dir, {**os.environ, "PYTHONPATH": "/theirs"})
    assert env["PYTHONPATH"] == f"{shipped}{os.pathsep}/theirs"
    # A rank's Python imports the shipped copy, ahead of the one installed beside mscon.
    where = subprocess.run(
        [sys.executable, "-c", "import mscon_resume; print(mscon_resume.__file__)"],
        env=env,
        cwd=tmp_path,  # not the repository, whose mscon_resume/ -c would find first
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert where == str(shipped / "mscon_resume" / "__init__.py")


@pytest.fixture
def shm_run(tmp_path: Path) -> Iterator[str]:
    run_dir = _run_dir(tmp_path)
    yield run_dir
    for path in store.alternates(layout.shm_snapshot_folder(run_dir)):
        if os.path.islink(path) or os.path.isfile(path):
            os.remove(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)


def test_the_agent_removes_only_its_own_shm_folders(shm_run: str, tmp_path: Path) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    first = layout.shm_snapshot_folder(shm_run)
    names = store.alternates(store.shm_folder(layout.checkpoint_folder(shm_run)))
    assert names == [first] + [
        f"{first}.{i}" for i in range(1, layout._SHM_ALTERNATES)
    ]  # one rule, two packages
    assert layout.own_shm_snapshot_folders(shm_run) == []
    os.mkdir(names[1], 0o700)
    os.mkdir(names[4], 0o700)
    assert layout.own_shm_snapshot_folders(shm_run) == [names[1], names[4]]
    if os.getuid() == 0:
        os.mkdir(first, 0o700)
        os.chown(first, NOBODY, NOBODY)  # another user's, at the first name: never ours to remove
    os.symlink(tmp_path, names[2])  # a link to a folder of ours is no folder of ours
    Path(names[3]).write_text("")
    assert layout.own_shm_snapshot_folders(shm_run) == [names[1], names[4]]
