"""mscon_resume's snapshot store, agreement and interval (no MindSpore): atomic writes, damaged or
foreign files skipped, the resume step agreed between snapshots and checkpoints, the copy
interval; and the store's security: private 0700 folders, 0600 files made exclusively and never
through a link, a MAC under the run's key on every snapshot."""

from __future__ import annotations

import io
import math
import os
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_for
from mscon.trainer import checkpoint

from mscon_resume import collective, core, interval, resumable, snapfile, store
from mscon_resume.metrics import MetricsWriter

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
NOBODY = 65534  # another user's uid (nobody): these tests run as root and chown to it


class _Param:
    """What ``take`` reads of a MindSpore Parameter: asnumpy(), sharing its memory as on CPU."""

    def __init__(self, name: str, data: np.ndarray) -> None:
        self.name, self.data, self.nbytes = name, data, data.nbytes

    def asnumpy(self) -> np.ndarray:
        return self.data


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc1.weight": rng.standard_normal((8, 4)).astype(np.float32), "moment.fc1": np.arange(3.0)}


def _root(tmp_path: Path, name: str = "snap") -> str:
    got = store.make_private(str(tmp_path / name))
    assert got == str(tmp_path / name)
    return got


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _said(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("mscon_resume: ")]


@pytest.fixture
def umask0() -> Iterator[None]:
    """The most permissive umask: what the store makes must be private whatever the umask."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _require_root() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder of another user")


# ---------------------------------------------------------------- files


def test_write_read_round_trip_and_keeps_the_newest_two(tmp_path: Path) -> None:
    root = _root(tmp_path)
    for step in (1, 2, 3):
        store.write(root, 0, step, _arrays(step), {"epoch": 1}, KEY)
    assert store.steps(root, 0) == [2, 3]
    snap = store.read(root, 0, 3, KEY)
    assert snap is not None and snap.step == 3 and snap.meta["epoch"] == 1
    for name, want in _arrays(3).items():
        np.testing.assert_array_equal(snap.arrays[name], want)


def test_the_oldest_is_dropped_before_the_next_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KEEP states at most on disk at any time, a temp file being written included."""
    root = _root(tmp_path)
    for step in (1, 2):
        store.write(root, 0, step, _arrays(step), {}, KEY)
    seen: list[list[str]] = []
    dump = snapfile.dump

    def spy(f: object, *args: object, **kwargs: object) -> snapfile.Costs:
        seen.append(sorted(os.listdir(store.rank_dir(root, 0))))  # during the write: the temp file is there
        return dump(f, *args, **kwargs)

    monkeypatch.setattr(store.snapfile, "dump", spy)
    store.write(root, 0, 3, _arrays(3), {}, KEY)
    assert len(seen) == 1 and len(seen[0]) == store.KEEP
    assert "snap_2.msnap" in seen[0] and any(n.startswith(".snap_3.") and n.endswith(".tmp") for n in seen[0])
    assert sorted(os.listdir(store.rank_dir(root, 0))) == ["snap_2.msnap", "snap_3.msnap"]


def test_a_write_goes_over_the_dropped_snapshots_file(tmp_path: Path, umask0: None) -> None:
    """Node memory's pages already there: the third write reuses the first's file (its inode),
    renamed away before it is written over, still 0600; each file holds its own step's values."""
    root = _root(tmp_path)
    written = [store.write(root, 0, step, _arrays(step), {"epoch": 0}, KEY) for step in (1, 2)]
    first = os.stat(written[0].path).st_ino
    assert not any(w.reused for w in written)
    small = {"fc1.weight": np.zeros((2, 2), np.float32)}  # smaller than the file it goes over
    third = store.write(root, 0, 3, small, {"epoch": 0}, KEY)
    assert third.reused and os.stat(third.path).st_ino == first and _mode(third.path) == 0o600
    assert store.steps(root, 0) == [2, 3]
    got = {s.step: s for s in store.newest_valid([root], 0, KEY)}
    np.testing.assert_array_equal(got[3].arrays["fc1.weight"], small["fc1.weight"])
    assert set(got[3].arrays) == {"fc1.weight"}
    np.testing.assert_array_equal(got[2].arrays["moment.fc1"], _arrays(2)["moment.fc1"])
    assert third.mac_s >= 0 and third.io_s >= 0


@pytest.mark.parametrize("why", ["open to others", "another name"])
def test_a_dropped_file_not_private_is_not_written_over(tmp_path: Path, why: str) -> None:
    root = _root(tmp_path)
    for step in (1, 2):
        store.write(root, 0, step, _arrays(step), {}, KEY)
    oldest = store.path(root, 0, 1)
    before = Path(oldest).read_bytes()
    elsewhere = tmp_path / "elsewhere"
    if why == "open to others":
        os.chmod(oldest, 0o644)
    else:
        os.link(oldest, elsewhere)
    third = store.write(root, 0, 3, _arrays(3), {}, KEY)
    assert not third.reused and _mode(third.path) == 0o600
    assert sorted(os.listdir(store.rank_dir(root, 0))) == ["snap_2.msnap", "snap_3.msnap"]
    if why == "another name":
        assert elsewhere.read_bytes() == before  # never written through the other name
    assert store.read(root, 0, 3, KEY) is not None


def test_snapshots_of_the_format_before_are_said_not_read_and_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An npz of the library before (an upgrade between a failure and its relaunch): one line,
    the rank starts afresh, and its first write drops it."""
    root = _root(tmp_path)
    folder = Path(store.rank_dir(root, 0))
    folder.mkdir(mode=0o700)
    np.savez(folder / "snap_4.npz", w=np.zeros(2))
    assert store.steps(root, 0) == [] and store.newest_valid([root], 0, KEY) == []
    said = _said(capsys)
    assert len(said) == 1 and "snap_4.npz of an earlier mscon_resume's format, not read" in said[0]
    store.write(root, 0, 1, _arrays(1), {}, KEY)
    assert os.listdir(folder) == ["snap_1.msnap"]


def test_a_write_killed_midway_leaves_no_snapshot(tmp_path: Path) -> None:
    root = _root(tmp_path)
    store.write(root, 0, 4, _arrays(4), {}, KEY)
    # What a kill during the write leaves: the temp file, half written, never renamed.
    full = Path(store.path(root, 0, 4)).read_bytes()
    (Path(store.rank_dir(root, 0)) / ".snap_5.123.abcd.tmp").write_bytes(full[: len(full) // 2])
    assert store.steps(root, 0) == [4]
    assert [s.step for s in store.newest_valid([root], 0, KEY)] == [4]


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("truncate", "its MAC does not match"),
        ("flip", "its MAC does not match"),  # a bit flipped inside the weights: no CRC, the MAC sees it
        ("flip-mac", "its MAC does not match"),
        ("stub", "snapshot of step 7 (rank 0) unreadable (Unreadable)"),  # cut inside its first bytes
    ],
)
def test_a_damaged_snapshot_is_skipped_for_the_older_one(
    tmp_path: Path, damage: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root(tmp_path)
    for step in (6, 7):
        store.write(root, 0, step, _arrays(step), {}, KEY)
    newest = Path(store.path(root, 0, 7))
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "flip":
        data[-snapfile.MAC_BYTES - 10] ^= 0x01  # the last array's bytes
    elif damage == "flip-mac":
        data[-1] ^= 0x01
    else:
        data = data[:20]
    newest.write_bytes(bytes(data))
    assert store.read(root, 0, 7, KEY) is None
    assert [s.step for s in store.newest_valid([root], 0, KEY)] == [6]
    lines = _said(capsys)
    assert len(lines) == 2 and all(said in line for line in lines), lines  # one line per read, none else


def test_the_copy_is_taken_at_submit_not_when_written(tmp_path: Path) -> None:
    root = _root(tmp_path)
    weight = np.zeros(4, dtype=np.float32)
    writer = store.Writer(root, 0, KEY)
    writer.submit(1, [("w", _Param("w", weight))], {})
    weight += 5.0  # the next step updates the parameter in place while the write may still run
    writer.wait()
    snap = store.read(root, 0, 1, KEY)
    assert snap is not None
    np.testing.assert_array_equal(snap.arrays["w"], np.zeros(4, dtype=np.float32))
    assert writer.error is None and writer.count == 1


def test_a_failing_write_is_recorded_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = store.Writer(str(blocker), 0, KEY)  # its rank folder cannot be made under a file
    writer.submit(1, [("w", _Param("w", np.zeros(2)))], {})
    writer.wait()
    assert isinstance(writer.error, OSError)


def test_snapshots_go_to_shm_when_it_has_room_else_beside_the_state(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    state = str(tmp_path / "ck")
    dirs = store.candidate_dirs(state, shm=str(shm))
    assert dirs == [store.shm_folder(state, shm=str(shm)), str(tmp_path / "ck" / "snapshots")]
    assert dirs[0].startswith(str(shm / store.SHM_PREFIX))
    assert store.choose_dir(dirs, 1 << 60, shm=str(shm)) == dirs[1]  # no room: beside the state
    assert store.private(dirs[1]) and not os.path.exists(dirs[0])
    assert store.choose_dir(dirs, 1024, shm=str(shm)) == dirs[0]  # room: node memory
    assert store.private(dirs[0])
    assert store.candidate_dirs("rel", shm=str(shm))[1] == os.path.abspath("rel/snapshots")


# ---------------------------------------------------------------- the agreement


def _checkpoint_marker(root: Path, step: int) -> None:
    """A complete checkpoint as checkpoint.complete_steps sees it (the file and its marker)."""
    folder = root / "rank_0"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"step_{step}.ckpt").write_bytes(b"")
    (folder / f"step_{step}.ckpt.done").write_text("{}")


def _agree_alone(ck: Path | None, mine: list[int], every: int = 10, max_step: int = 40) -> tuple[int, bool]:
    """One rank, as trainer/train.py asks: its checkpoints' slots and its snapshot steps."""
    slots = checkpoint.slot_vector(str(ck) if ck else None, 0, every, max_step)
    return collective.agree(0, 1, mine, store.KEEP, slots, lambda c: checkpoint.agreed_step(c, 1, every))


def test_agree_takes_the_newer_of_snapshot_and_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    _checkpoint_marker(ck, 10)
    assert _agree_alone(ck, [12, 11]) == (12, True)
    _checkpoint_marker(ck, 20)
    assert _agree_alone(ck, [12, 11]) == (20, False)
    assert _agree_alone(ck, []) == (20, False)
    assert _agree_alone(None, []) == (0, False)
    assert _agree_alone(ck, [20, 19]) == (20, True)  # a tie: node memory, no file to read
    assert collective.agree(0, 1, [5000], store.KEEP) == (5000, True)  # beyond float32's 2**24 halves
    assert collective.agree(0, 1, [], store.KEEP) == (0, False)


def test_agree_alone_exchanges_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cluster(vec: np.ndarray) -> np.ndarray:
        raise AssertionError("a single process has nobody to exchange with")

    monkeypatch.setattr(collective, "all_reduce_sum", no_cluster)
    assert collective.agree(0, 1, [7, 6], store.KEEP) == (7, True)
    assert collective.agree_max(3, 0, 1) == 3


def test_ranks_agree_on_the_newest_step_every_rank_has(monkeypatch: pytest.MonkeyPatch) -> None:
    """The AllReduce(SUM) simulated: each rank's vector recorded, then every rank gets the sum."""
    have = {0: [12, 11], 1: [11, 10], 2: [12, 11]}
    sent: dict[int, np.ndarray] = {}
    for rank, mine in have.items():
        monkeypatch.setattr(collective, "all_reduce_sum", lambda v, r=rank: sent.setdefault(r, v.copy()))
        collective.agree(rank, len(have), mine, store.KEEP)
    total = sum(sent.values())
    monkeypatch.setattr(collective, "all_reduce_sum", lambda v: total)
    assert {collective.agree(r, len(have), m, store.KEEP) for r, m in have.items()} == {(11, True)}
    have[1] = []  # a rank with nothing: no common step
    sent.clear()
    for rank, mine in have.items():
        monkeypatch.setattr(collective, "all_reduce_sum", lambda v, r=rank: sent.setdefault(r, v.copy()))
        collective.agree(rank, len(have), mine, store.KEEP)
    total = sum(sent.values())
    monkeypatch.setattr(collective, "all_reduce_sum", lambda v: total)
    assert collective.agree(0, len(have), have[0], store.KEEP) == (0, False)


# ---------------------------------------------------------------- the interval


def test_budget_interval_keeps_the_copy_under_its_share_of_the_step() -> None:
    assert interval.budget_interval(0.0001, 0.1, 0.02) == 1  # 0.1 ms copy, 100 ms step: every step
    # The toy MLP on CPU: a 0.14 ms copy is 7.9 % of its 1.78 ms step, over the 2 % budget (4 steps
    # by the budget alone), but under FREE_COST_S (3 ms): a snapshot that cheap is taken every
    # step, since no real step notices it and a restart then loses one step at most.
    assert interval.FREE_COST_S == 0.003
    assert interval.budget_interval(0.14e-3, 1.78e-3, 0.02) == 1
    assert interval.budget_interval(interval.FREE_COST_S, 1e-3, 0.02) == 1
    assert interval.budget_interval(0.005, 0.1, 0.02) == 3  # above it the budget decides
    assert interval.budget_interval(2.0, 1.0, 0.02) == 100
    assert interval.budget_interval(0.0, 1.0, 0.02) == 1 and interval.budget_interval(1.0, 0.0, 0.02) == 1


@pytest.mark.parametrize(("copy_s", "want"), [(0.004, 20), (0.003, 1)])
def test_an_auto_interval_snapshots_every_step_until_it_is_agreed(copy_s: float, want: int) -> None:
    fixed = interval.Interval(3, 0.02)
    assert [s for s in range(1, 10) if fixed.due(s)] == [3, 6, 9]
    assert fixed.observe(1.0, 0.5, 0, 1) is None  # a fixed interval is never re-decided
    auto = interval.Interval(interval.AUTO, 0.02)
    decided = []
    for step in range(1, 30):
        assert auto.due(step) == (not decided or step % decided[0] == 0)
        got = auto.observe(5.0 if step == 1 else 0.01, copy_s, 0, 1)  # the first step compiles
        if got is not None:
            decided.append(got)
    # 4 ms copy / (2 % of 10 ms) = 20 steps, decided once, after the probe steps; a 3 ms one is
    # under FREE_COST_S: every step.
    assert decided == [want]
    assert interval.Interval(0, 0.02).due(4) is False


def test_the_auto_interval_is_said_with_the_costs_it_was_chosen_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 0's one line: the interval, each part of a snapshot's cost and the step it was set against."""
    monkeypatch.setattr(collective, "rank_and_size", lambda: (0, 1))
    monkeypatch.setattr(core.rng, "capture", lambda: ({}, {}))
    monkeypatch.setattr(core, "_host_computes", lambda: True)
    r = core.Resumer(str(tmp_path / "state"), every=interval.AUTO, metrics=MetricsWriter(""))
    r.roots = [str(tmp_path / "snapshots")]
    r.keep([("w", _Param("w", np.zeros(1000, dtype=np.float32)))])
    for step in range(1, interval.Interval.PROBE_STEPS + 3):
        r.stepped(step, 0, step, 1.0)
    r.finish()
    said = [line for line in _said(capsys) if "(auto)" in line]
    pattern = (
        r"mscon_resume: a snapshot every 1 step\(s\) \(auto\): copy \d+\.\d ms on the step, "
        r"write \d+\.\d ms \(MAC \d+\.\d ms\) in the background \(counted: the host computes the step\), "
        r"wait for the write before \d+\.\d ms, against a 1000 ms step, budget 2 %$"
    )
    assert len(said) == 1 and re.match(pattern, said[0]), said


@pytest.mark.parametrize(
    ("host", "waits", "want_ms"),
    [
        (True, [0.0, 0.0, 0.0], 12 + 80),  # CPU: the copy and the write's CPU time, which takes cores
        (False, [0.0, 0.0, 0.0], 12),  # an accelerator: the copy alone while the write keeps up
        (False, [0.05, 0.05, 0.05], 12 + 50),  # ... and the step's wait when it does not
        (True, [0.2, 0.2, 0.2], 12 + 200),  # CPU, the write slower than a step: its wait (not both)
    ],
)
def test_a_snapshots_cost_counts_the_steps_wait_for_a_write_that_cannot_keep_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: bool, waits: list[float], want_ms: int
) -> None:
    monkeypatch.setattr(collective, "rank_and_size", lambda: (0, 1))
    monkeypatch.setattr(core, "_host_computes", lambda: host)
    r = core.Resumer(str(tmp_path / "state"), every=interval.AUTO, metrics=MetricsWriter(""))
    r.writer = store.Writer(str(tmp_path / "snapshots"), 0, KEY)
    r.writer.copies, r.writer.writes, r.writer.waits = [0.012] * 3, [0.08] * 3, waits
    assert r._snapshot_cost() == pytest.approx(want_ms / 1e3)
    # A 1 s step, budget 2 %: every step while the snapshot costs at most 20 ms of it.
    assert interval.budget_interval(r._snapshot_cost(), 1.0, 0.02) == math.ceil(want_ms / 20)


def test_the_typical_costs_leave_out_the_first_snapshots_that_fault_their_memory_in(tmp_path: Path) -> None:
    w = store.Writer(str(tmp_path), 0, KEY)
    # As the auto interval sees them at its decision (6 snapshots): the first three fault pages in.
    w.copies = [0.033, 0.030, 0.030, 0.014, 0.014, 0.014]
    w.writes = [0.110, 0.056, 0.056, 0.056, 0.056, 0.056]
    assert w.typical_copy_s() == 0.014 and w.typical_write_s() == 0.056
    w.copies = [0.033, 0.030]  # too few to leave any out
    assert w.typical_copy_s() == 0.033


# ---------------------------------------------------------------- security: folders


def test_folders_are_made_0700_and_files_0600_whatever_the_umask(tmp_path: Path, umask0: None) -> None:
    root = store.make_private(str(tmp_path / "a" / "snap"))
    assert root == str(tmp_path / "a" / "snap")
    assert _mode(root) == 0o700 and _mode(tmp_path / "a") == 0o700
    store.write(root, 0, 1, _arrays(1), {}, KEY)
    assert _mode(store.rank_dir(root, 0)) == 0o700
    assert _mode(store.path(root, 0, 1)) == 0o600
    store.folder_key(root)
    assert _mode(os.path.join(root, ".key")) == 0o600
    shm = tmp_path / "shm"
    shm.mkdir()
    chosen = store.choose_dir(store.candidate_dirs(str(tmp_path / "state"), shm=str(shm)), 1, shm=str(shm))
    assert chosen is not None and _mode(chosen) == 0o700


def test_a_folder_of_another_user_is_passed_over_and_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _require_root()
    name = tmp_path / "snap"
    name.mkdir(mode=0o700)
    os.chown(name, NOBODY, NOBODY)  # someone else took the name first (a planted folder)
    said: set = set()
    assert store.make_private(str(name), said) == f"{name}.1"
    assert store.make_private(str(name), said) == f"{name}.1"  # every rank and attempt: the same
    assert store.choose_dir([str(name)], 1, said=said) == f"{name}.1"
    lines = _said(capsys)
    assert len(lines) == 1 and str(name) in lines[0] and f"{name}.1" in lines[0]
    assert os.stat(name).st_uid == NOBODY and _mode(f"{name}.1") == 0o700
    assert store.find_private(str(name)) == f"{name}.1"
    # What the other user's folder holds is never read, even a well-formed snapshot.
    store.write(str(name), 0, 9, _arrays(9), {}, KEY)
    os.chown(store.rank_dir(str(name), 0), NOBODY, NOBODY)
    assert store.newest_valid([str(name)], 0, KEY) == []


def test_a_link_at_the_folder_name_is_passed_over(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "snap").symlink_to(target)
    assert store.make_private(str(tmp_path / "snap")) == f"{tmp_path / 'snap'}.1"
    assert not store.private(str(tmp_path / "snap"))


def test_a_folder_of_ours_left_open_is_tightened(tmp_path: Path) -> None:
    name = tmp_path / "snap"
    name.mkdir()
    os.chmod(name, 0o755)  # made under an old umask
    assert not store.private(str(name)) and store.find_private(str(name)) is None
    assert store.make_private(str(name)) == str(name)
    assert _mode(name) == 0o700 and store.private(str(name))


def test_no_folder_when_every_name_is_taken(tmp_path: Path) -> None:
    _require_root()
    name = tmp_path / "snap"
    for path in store.alternates(str(name)):
        os.mkdir(path, 0o700)
        os.chown(path, NOBODY, NOBODY)
    assert store.make_private(str(name), set()) is None
    assert store.choose_dir([str(name)], 1, said=set()) is None


def test_a_rank_folder_not_private_is_refused(tmp_path: Path) -> None:
    root = _root(tmp_path)
    os.mkdir(store.rank_dir(root, 0), 0o700)
    os.chmod(store.rank_dir(root, 0), 0o777)
    with pytest.raises(OSError, match="not this user's private folder"):
        store.write(root, 0, 1, _arrays(1), {}, KEY)
    assert store.steps(root, 0) == []


# ---------------------------------------------------------------- security: the MAC


def test_a_snapshot_under_another_key_is_skipped_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root(tmp_path)
    store.write(root, 0, 1, _arrays(1), {}, KEY)
    store.write(root, 0, 2, _arrays(2), {}, OTHER_KEY)  # planted, or another run's
    assert store.read(root, 0, 2, KEY) is None
    assert [s.step for s in store.newest_valid([root], 0, KEY)] == [1]
    assert any("its MAC does not match" in line and "snap_2.msnap" in line for line in _said(capsys))
    assert store.read(root, 0, 2, OTHER_KEY) is not None


def _rewritten(where: str, change: Callable[[dict, dict], None]) -> None:
    """The file at ``where`` made again, well formed, after ``change(info, arrays)``, under another
    key, with the original's MAC put back at its end: what someone without the key can make."""
    data = bytearray(Path(where).read_bytes())
    info, arrays = snapfile.load(data, KEY)
    arrays = {k: v.copy() for k, v in arrays.items()}
    change(info, arrays)
    buf = io.BytesIO()
    snapfile.dump(buf, arrays, info, OTHER_KEY)
    remade = buf.getvalue()[: -snapfile.MAC_BYTES] + bytes(data[-snapfile.MAC_BYTES :])
    Path(where).write_bytes(remade)
    got_info, got = snapfile.load(bytearray(buf.getvalue()), OTHER_KEY)  # a well-formed file
    assert got_info == info and all(np.array_equal(got[k], arrays[k]) for k in arrays)


def test_a_rewritten_snapshot_with_the_old_mac_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A well-formed file, the MAC of the original: the arrays changed, so it no longer matches."""
    root = _root(tmp_path)
    for step in (1, 2):
        store.write(root, 0, step, _arrays(step), {"epoch": 0}, KEY)
    _rewritten(store.path(root, 0, 2), lambda info, arrays: arrays["moment.fc1"].__iadd__(1))
    assert store.read(root, 0, 2, KEY) is None
    assert [s.step for s in store.newest_valid([root], 0, KEY)] == [1]
    assert any("its MAC does not match" in line for line in _said(capsys))
    # The meta changed instead (a later epoch claimed): no match either.
    _rewritten(store.path(root, 0, 1), lambda info, arrays: info.update(epoch=5))
    assert store.newest_valid([root], 0, KEY) == []


def test_a_snapshot_of_another_user_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _require_root()
    root = _root(tmp_path)
    store.write(root, 0, 1, _arrays(1), {}, KEY)
    os.chown(store.path(root, 0, 1), NOBODY, NOBODY)
    assert store.read(root, 0, 1, KEY) is None
    assert any("is not this user's file" in line for line in _said(capsys))


# ---------------------------------------------------------------- security: links


def test_a_link_at_a_snapshot_name_is_never_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root(tmp_path)
    store.write(root, 0, 1, _arrays(1), {}, KEY)
    elsewhere = _root(tmp_path, "elsewhere")
    store.write(elsewhere, 0, 2, _arrays(2), {}, KEY)
    outside = tmp_path / "outside.npz"  # a valid snapshot of step 2 even, under the run's key
    outside.write_bytes(Path(store.path(elsewhere, 0, 2)).read_bytes())
    os.symlink(outside, store.path(root, 0, 2))
    assert store.steps(root, 0) == [1, 2]
    assert store.read(root, 0, 2, KEY) is None  # O_NOFOLLOW: refused, never opened through the link
    assert any("snapshot of step 2 (rank 0) unreadable (OSError)" in line for line in _said(capsys))
    assert [s.step for s in store.newest_valid([root], 0, KEY)] == [1]
    # Writing at a linked name replaces the link, never writes through it.
    before = outside.read_bytes()
    store.write(root, 0, 2, _arrays(2), {}, KEY)
    assert outside.read_bytes() == before
    assert stat.S_ISREG(os.lstat(store.path(root, 0, 2)).st_mode)
    assert store.read(root, 0, 2, KEY) is not None


def test_a_link_at_the_temp_name_is_never_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _root(tmp_path)
    store.write(root, 0, 1, _arrays(1), {}, KEY)
    folder = Path(store.rank_dir(root, 0))
    target = tmp_path / "target"
    target.write_text("untouched")
    # A leftover at a temp name (a killed write's, or a link) goes before the next write ...
    (folder / f".snap_2.{os.getpid()}.feedbeef.tmp").symlink_to(target)
    store.write(root, 0, 2, _arrays(2), {}, KEY)
    assert target.read_text() == "untouched"
    assert sorted(os.listdir(folder)) == ["snap_1.msnap", "snap_2.msnap"]

    # ... and one planted in the race between that and the write's own use of the name: over a
    # dropped snapshot's file, the rename replaces the link itself (never follows it); a new file's
    # O_CREAT | O_EXCL fails on any existing name, a link included, and never follows it.
    planted: list[Path] = []

    def plant(n: int) -> str:
        step = len(planted) + 3
        rank_folder = Path(store.rank_dir(root, 0 if step == 3 else 1))
        rank_folder.mkdir(mode=0o700, exist_ok=True)
        link = rank_folder / f".snap_{step}.{os.getpid()}.feedbeef.tmp"
        link.symlink_to(target if step < 5 else tmp_path / "created-through-the-link")
        planted.append(link)
        return "feedbeef"

    monkeypatch.setattr(store.secrets, "token_hex", plant)
    assert store.write(root, 0, 3, _arrays(3), {}, KEY).reused  # over snap_1's file
    assert target.read_text() == "untouched" and store.steps(root, 0) == [2, 3]
    assert stat.S_ISREG(os.lstat(store.path(root, 0, 3)).st_mode)
    with pytest.raises(FileExistsError):  # rank 1 has nothing to go over: a new file
        store.write(root, 1, 4, _arrays(4), {}, KEY)
    assert target.read_text() == "untouched" and planted[1].is_symlink()
    with pytest.raises(FileExistsError):  # a dangling link: nothing is created where it points
        store.write(root, 1, 5, _arrays(5), {}, KEY)
    assert not (tmp_path / "created-through-the-link").exists()
    writer = store.Writer(root, 1, KEY)  # in the background: recorded, not raised
    writer.submit(6, [("w", _Param("w", np.zeros(2)))], {})
    writer.wait()
    assert isinstance(writer.error, FileExistsError)
    assert store.steps(root, 1) == []


def test_a_linked_key_is_refused(tmp_path: Path) -> None:
    root = _root(tmp_path)
    other = tmp_path / "other"
    other.write_bytes(os.urandom(32))
    os.chmod(other, 0o600)
    os.symlink(other, os.path.join(root, ".key"))
    with pytest.raises(OSError):
        store.folder_key(root)


# ---------------------------------------------------------------- the key


def test_folder_key_without_the_run_key_is_made_once_0600(tmp_path: Path, umask0: None) -> None:
    root = _root(tmp_path)
    key = store.folder_key(root)
    assert len(key) == 32 and _mode(os.path.join(root, ".key")) == 0o600
    assert store.folder_key(root) == key
    assert sorted(os.listdir(root)) == [".key"]  # no temp file left behind
    store.write(root, 0, 1, _arrays(1), {}, key)
    assert [s.step for s in store.newest_valid([root], 0, None)] == [1]  # the folder's key is found
    os.chmod(os.path.join(root, ".key"), 0o644)
    with pytest.raises(OSError, match="not this user's private file"):
        store.folder_key(root)
    assert store.newest_valid([root], 0, None) == []


def _key_in_threads(root: str, n: int) -> tuple[list[bytes], list[BaseException]]:
    barrier = threading.Barrier(n)
    keys: list[bytes] = []
    errors: list[BaseException] = []

    def call() -> None:
        barrier.wait()
        try:
            keys.append(store.folder_key(root))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return keys, errors


def test_concurrent_callers_get_the_same_key_threads(tmp_path: Path) -> None:
    for attempt in range(5):
        root = _root(tmp_path, f"snap{attempt}")
        keys, errors = _key_in_threads(root, 8)
        assert not errors and len(keys) == 8 and len(set(keys)) == 1
        assert sorted(os.listdir(root)) == [".key"]


_KEY_IN_CHILD = """
import os, sys, time
from mscon_resume import store
open(sys.argv[3], "w").close()  # imports done: ready to go
while not os.path.exists(sys.argv[2]):  # all ready: go together
    time.sleep(0.001)
print(store.folder_key(sys.argv[1]).hex())
"""


def test_concurrent_callers_get_the_same_key_processes(tmp_path: Path) -> None:
    root = _root(tmp_path)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _KEY_IN_CHILD, root, str(go), str(tmp_path / f"ready{i}")],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    ready = [tmp_path / f"ready{i}" for i in range(4)]
    try:
        wait_for(lambda: all(r.exists() for r in ready), 60, "the 4 children to finish their imports")
    except AssertionError:
        for p in procs:
            p.kill()
        raise
    go.touch()
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0] * 4
    assert len(keys) == 1 and bytes.fromhex(keys.pop()) == store.folder_key(root)
    assert sorted(os.listdir(root)) == [".key"]


# ---------------------------------------------------------------- removal


def test_remove_drops_the_rank_folder_and_the_root_once_empty(tmp_path: Path) -> None:
    root = _root(tmp_path)
    key = store.folder_key(root)
    for rank in (0, 1):
        store.write(root, rank, 1, _arrays(1), {}, key)
    store.remove([root, str(tmp_path / "never-made")], 0)
    assert not os.path.exists(store.rank_dir(root, 0)) and os.path.isdir(store.rank_dir(root, 1))
    assert os.path.exists(os.path.join(root, ".key"))  # rank 1 still needs it
    store.remove([root], 1)
    assert not os.path.exists(root)


def test_remove_leaves_another_users_folder(tmp_path: Path) -> None:
    _require_root()
    name = tmp_path / "snap"
    name.mkdir(mode=0o700)
    os.mkdir(name / "rank_0", 0o700)
    os.chown(name, NOBODY, NOBODY)
    mine = store.make_private(str(name))
    store.write(mine, 0, 1, _arrays(1), {}, KEY)
    store.remove([str(name)], 0)
    assert not os.path.exists(mine)
    assert (name / "rank_0").is_dir()  # not ours: never removed


# ---------------------------------------------------------------- a later launch in the same folder


def test_a_fresh_start_drops_the_abandoned_launchs_snapshots(tmp_path: Path) -> None:
    """A launch that starts over (no MSCON_RESUME) in the folder of a killed one: its first write
    drops the killed launch's later steps, so a resume of *this* launch never goes back to them
    and it keeps KEEP states of its own."""
    root = _root(tmp_path)
    for step in (12, 13):  # the killed launch's
        store.write(root, 0, step, _arrays(step), {"launch": 1}, KEY)
    for step in (1, 2, 3, 4, 5):  # the fresh one's, killed after step 5
        store.write(root, 0, step, _arrays(step), {"launch": 2}, KEY)
        assert store.steps(root, 0) == list(range(max(1, step - 1), step + 1))
    assert [(s.step, s.meta["launch"]) for s in store.newest_valid([root], 0, KEY)] == [(5, 2), (4, 2)]


def test_a_resume_from_an_older_step_drops_the_newer_snapshots_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks agreed on step 12 (another rank lacked 13): this rank's first write, step 13 again,
    keeps the 12 it resumed from while it writes, not the abandoned 13."""
    root = _root(tmp_path)
    for step in (12, 13):
        store.write(root, 0, step, _arrays(step), {}, KEY)
    seen: list[list[str]] = []
    dump = snapfile.dump

    def spy(f: object, *args: object, **kwargs: object) -> snapfile.Costs:
        seen.append(sorted(os.listdir(store.rank_dir(root, 0))))
        return dump(f, *args, **kwargs)

    monkeypatch.setattr(store.snapfile, "dump", spy)
    store.write(root, 0, 13, _arrays(99), {}, KEY)
    assert len(seen) == 1 and "snap_12.msnap" in seen[0] and "snap_13.msnap" not in seen[0]
    assert store.steps(root, 0) == [12, 13]


def test_a_killed_writes_temp_file_goes_with_the_next_write(tmp_path: Path) -> None:
    """At most KEEP states on disk: what a rank killed mid-write left is dropped by the next launch."""
    root = _root(tmp_path)
    store.write(root, 0, 4, _arrays(4), {}, KEY)
    stale = Path(store.rank_dir(root, 0)) / ".snap_5.123.abcd.tmp"
    stale.write_bytes(b"half a snapshot")
    store.write(root, 0, 5, _arrays(5), {}, KEY)
    assert sorted(os.listdir(store.rank_dir(root, 0))) == ["snap_4.msnap", "snap_5.msnap"]


# ---------------------------------------------------------------- the collectives of a step


def test_every_rank_agrees_on_the_auto_interval_even_one_without_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The auto interval's AllReduce is a collective: a rank that found no folder for its
    snapshots (no writer) must still call it at the same step as the others, or their next
    collectives pair up wrong (a hang, or the gradients summed with the interval's vector)."""
    calls: dict[int, list[int]] = {0: [], 1: []}

    def agree_max(mine: int, rank: int, size: int) -> int:
        calls[rank].append(step)
        return 1

    monkeypatch.setattr(interval, "agree_max", agree_max)
    monkeypatch.setattr(collective, "agree_max", agree_max)
    monkeypatch.setattr(core.rng, "capture", lambda: ({}, {}))  # MindSpore's generator left out
    ranks = []
    for rank, state in ((0, tmp_path / "state"), (1, tmp_path / "file" / "state")):
        monkeypatch.setattr(collective, "rank_and_size", lambda rank=rank: (rank, 2))
        ranks.append(core.Resumer(str(state), every=interval.AUTO, metrics=MetricsWriter("")))
        ranks[-1].roots = [str(state / "snapshots")]  # no node memory: only the state folder
    (tmp_path / "file").write_text("")  # rank 1's state folder cannot be made: no snapshots there
    for r in ranks:
        r.keep([("w", _Param("w", np.zeros(2, dtype=np.float32)))])
    assert ranks[0].writer is not None and ranks[1].writer is None
    for step in range(1, 10):
        for r in ranks:
            r.stepped(step, 0, step, 0.01)
    assert calls[0] == calls[1] == [interval.Interval.PROBE_STEPS + 1]
    for r in ranks:
        r.settle()
    assert calls[0] == calls[1] and len(calls[0]) == 2
    for r in ranks:
        r.finish()


def test_a_callback_takes_no_snapshot_where_it_cannot_resume_so_a_rank_ahead_still_shares_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``Model.train`` callback never resumes at an epoch's end. Had it snapshotted there (every
    2 steps, 3 an epoch: step 12), rank 0 a step ahead of killed rank 1 would keep {12, 14} and
    rank 1 {10, 12}: nothing both can resume at, and both started over (seen on CI)."""
    monkeypatch.setattr(collective, "agree_max", lambda mine, rank, size: mine)
    monkeypatch.setattr(core.rng, "capture", lambda: ({}, {}))
    ranks = []
    for rank in (0, 1):
        monkeypatch.setattr(collective, "rank_and_size", lambda rank=rank: (rank, 2))
        r = core.Resumer(str(tmp_path / "state"), every=2, metrics=MetricsWriter(""))
        r.roots = [str(tmp_path / "snapshots")]
        r.resumable = resumable.at_callback_step
        r.extra.update(total=24, per_epoch=3)
        r.keep([("w", _Param("w", np.zeros(2, dtype=np.float32)))])
        ranks.append(r)
    for r, last in zip(ranks, (14, 13), strict=True):
        for step in range(1, last + 1):
            r.stepped(step, (step - 1) // 3, (step - 1) % 3 + 1, 0.01)
        r.settle()
    usable = [
        {s.step for s in store.newest_valid(r.roots, r.rank, r.key, r.stage) if resumable.at_callback_step(
            s.step, s.meta["pos"], s.meta)}
        for r in ranks
    ]  # fmt: skip
    assert 12 not in store.steps(ranks[0].roots[0], 0)
    assert usable[0] & usable[1] == {10}, usable


def test_each_copy_goes_into_the_pages_of_the_file_it_is_written_as(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the second snapshot on, the step's copy goes into a mapped file's pages and its write
    only MACs it there; the files alternate (the fourth goes over the second's, renamed away
    first), each holds its own step's values, 0600, never more than KEEP in the folder."""
    root = _root(tmp_path)
    placed: list[frozenset] = []
    dump = snapfile.dump

    def spy(f: object, arrays: dict, info: dict, key: bytes, done: frozenset = frozenset()) -> snapfile.Costs:
        placed.append(done)
        return dump(f, arrays, info, key, done)

    monkeypatch.setattr(store.snapfile, "dump", spy)
    on_disk: list[int] = []  # files in the folder as a mapped file takes its room: KEEP at most
    fallocate = os.posix_fallocate

    def room(fd: int, offset: int, size: int) -> None:
        on_disk.append(len(os.listdir(store.rank_dir(root, 0))))
        fallocate(fd, offset, size)

    monkeypatch.setattr(store.os, "posix_fallocate", room)
    w = store.Writer(root, 0, KEY)
    data = np.zeros(1000, dtype=np.float32)
    params = [("w", _Param("w", data)), ("b", _Param("b", np.ones(3, dtype=np.float64)))]
    inode, used = {}, {}
    for step in range(1, 7):
        data[:] = step  # the training updates the parameter in place
        w.submit(step, params, {"epoch": 0, "pos": step}, extra={"rng": np.arange(step)})
        w.wait()
        assert w.error is None
        used[step] = w._files[-1] if step > 1 else None
        inode[step] = os.stat(store.path(root, 0, step)).st_ino
        assert _mode(store.path(root, 0, step)) == 0o600
        assert len(os.listdir(store.rank_dir(root, 0))) <= store.KEEP
    assert placed == [frozenset()] + [frozenset({"w", "b"})] * 5
    assert used[4] is used[2] and used[6] is used[2] and used[5] is used[3] and used[3] is not used[2]
    assert on_disk == [2, 2]  # the second's (beside the first) and the third's (over the first's)
    # Each file goes over the pages of the one it drops: the third's is the first's (not mapped).
    assert inode[1] == inode[3] == inode[5] and inode[2] == inode[4] == inode[6] and inode[1] != inode[2]
    got = store.newest_valid([root], 0, KEY)
    assert [s.step for s in got] == [6, 5]
    for snap in got:
        assert np.all(snap.arrays["w"] == snap.step) and list(snap.arrays["rng"]) == list(range(snap.step))
    w.close()
    assert w._files == [] and store.steps(root, 0) == [5, 6]  # unmapped; the snapshots stay


def test_a_parameter_that_changes_shape_goes_out_of_the_map_and_the_next_file_fits_it(tmp_path: Path) -> None:
    root = _root(tmp_path)
    w = store.Writer(root, 0, KEY)
    for step, n in enumerate((4, 4, 4, 6, 6, 6), start=1):
        w.submit(step, [("w", _Param("w", np.full(n, step, dtype=np.float32)))], {})
        w.wait()
        assert w.error is None
    for snap in store.newest_valid([root], 0, KEY):
        np.testing.assert_array_equal(snap.arrays["w"], np.full(6, snap.step, dtype=np.float32))
    assert all(f.layout[0][2] == [6] for f in w._files)
    w.close()


def test_no_room_to_map_falls_back_to_host_memory_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """posix_fallocate refuses (a full /dev/shm): no mapped file (a copy into a page node memory
    cannot back would kill the rank with SIGBUS); the copies go to host memory as before."""

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "posix_fallocate", full)
    root = _root(tmp_path)
    w = store.Writer(root, 0, KEY)
    for step in (1, 2, 3):
        w.submit(step, [("w", _Param("w", np.full(4, step, dtype=np.float32)))], {})
        w.wait()
    assert w._files == [] and w.error is None
    assert [s.step for s in store.newest_valid([root], 0, KEY)] == [3, 2]
    # Each copy went over the one before (written by then) in host memory: one copy kept, warm.
    held = w._host
    assert held is not None
    w.submit(4, [("w", _Param("w", np.full(4, 4, dtype=np.float32)))], {})
    assert w._host is not None and w._host["w"] is held["w"]
    w.wait()
    np.testing.assert_array_equal(store.newest_valid([root], 0, KEY)[0].arrays["w"], np.full(4, 4.0))
    said = [line for line in _said(capsys) if "host memory" in line]
    assert len(said) == 1 and "No space left on device" in said[0]
    assert not [n for n in os.listdir(store.rank_dir(root, 0)) if n.endswith(".tmp")]
