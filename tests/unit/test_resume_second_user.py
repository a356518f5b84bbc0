"""What a second local user can do to a rank's snapshots where node memory has no room and they
go under the state folder, in a home tree open to all (0755, common on clusters): nothing. They
can neither list nor read the snapshots, and a ``snapshots`` folder they made first is passed
over (run as root here; the second user is a real one, see tests/second_user.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from second_user import intruder_uid, run_as

from mscon_resume import store


@pytest.fixture
def intruder() -> int:
    if os.getuid() != 0:
        pytest.skip("needs root to act as a second user")
    uid = intruder_uid()
    if uid is None:
        pytest.skip("no second local user: useradd failed and there is no 'nobody'")
    return uid


def _open_home(tmp_path: Path) -> Path:
    """A node user's home and state folder, every folder 0755 (the umask of most clusters), with
    /tmp's pytest folders opened so the second user can walk to it."""
    tmp_path.chmod(0o755)
    for parent in tmp_path.parents:
        if parent == Path("/tmp") or parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o005)
    state = tmp_path / "home" / ".cache" / "mscon" / "runs" / "r1" / "node1" / "checkpoints"
    state.mkdir(parents=True)
    for folder in [tmp_path / "home", *(tmp_path / "home").rglob("*")]:
        folder.chmod(0o755)
    return state


def test_snapshots_under_an_open_home_are_private(tmp_path: Path, intruder: int) -> None:
    state = _open_home(tmp_path)
    old = os.umask(0o022)
    try:
        root = store.choose_dir(store.candidate_dirs(str(state)), 1 << 60)  # /dev/shm has no room
    finally:
        os.umask(old)
    assert root == str(state / "snapshots")
    key = store.folder_key(root)
    store.write(root, 0, 7, {"w": np.arange(4.0)}, {}, key)
    snap = Path(store.path(root, 0, 7))
    assert (Path(root).stat().st_mode & 0o777, snap.stat().st_mode & 0o777) == (0o700, 0o600)
    assert run_as(intruder, "ls", str(state)).returncode == 0  # the home tree itself is open
    for what in (root, store.rank_dir(root, 0)):
        assert run_as(intruder, "ls", what).returncode != 0, what
    for what in (str(snap), os.path.join(root, ".key")):
        assert run_as(intruder, "cat", what).returncode != 0, what


def test_a_snapshots_folder_the_second_user_made_first_is_passed_over(
    tmp_path: Path, intruder: int, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _open_home(tmp_path)
    state.chmod(0o777)  # a careless parent: the second user can make the folder first
    planted = state / "snapshots"
    assert run_as(intruder, "mkdir", "-m", "777", str(planted)).returncode == 0
    assert run_as(intruder, "mkdir", "-m", "777", str(planted / "rank_0")).returncode == 0
    bait = planted / "rank_0" / "snap_99.npz"
    assert run_as(intruder, "sh", "-c", 'cat > "$0"', str(bait), data=b"PK not a snapshot").returncode == 0
    root = store.choose_dir(store.candidate_dirs(str(state)), 1 << 60, said=set())
    assert root == f"{planted}.1"
    assert (
        f"{planted} is not this user's private folder; snapshots go to {planted}.1" in capsys.readouterr().out
    )
    key = store.folder_key(root)
    store.write(root, 0, 3, {"w": np.arange(4.0)}, {}, key)
    # Resuming looks in this user's folder only: the bait is never read.
    got = store.newest_valid(store.candidate_dirs(str(state))[1:], 0, None)
    assert [s.step for s in got] == [3]
