"""The console's copies of a run (issue 33): what mscon fetches from the nodes into the run folder
(logs, the journal, checkpoints) and the run's recording are 0600 in 0700 folders whatever the
console's umask, and nothing is written through a link. The fetch over SSH:
tests/e2e/test_fetched_private_ssh.py."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import until
from mscon.agent import layout
from mscon.agent import protocol as P
from mscon.console.config.inventory import NodeSpec
from mscon.console.detach.record import RECORD, DetachRecord, write_record
from mscon.console.engine.bus import CONSOLE_ERR, EventBus
from mscon.console.engine.events import AgentEvent, Event, JobState, RunResult
from mscon.console.engine.summary import save_traceback, summary_file, write_json, write_summary
from mscon.console.history.recording import CompressedRecorder
from mscon.console.transport import slurm
from mscon.console.transport.local import LocalTransport
from mscon.console.transport.private_copy import private_text
from node_files import not_private


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that takes nothing away: every mode is what the code asked for."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _node_run(home: Path, name: str = "node1") -> tuple[LocalTransport, Path]:
    """A node's run folder, written as loosely as a job could: 0777 folders, 0666 files."""
    t = LocalTransport(NodeSpec(name=name, host="localhost", devices=1, transport="local"))
    t.home = str(home)
    run = Path(t.run_dir("r1"))
    attempt = Path(layout.attempt_folder(run, 0))
    ckpt = Path(layout.checkpoint_folder(str(run))) / "rank_0"
    for folder in (attempt, ckpt):
        folder.mkdir(parents=True, mode=0o777)
    for path, text in (
        (layout.log_file(attempt, "r0"), "step 1\n"),
        (layout.journal_file(str(run)), '{"attempt": 0}\n'),
        (str(ckpt / "step_3.ckpt"), "the weights"),
    ):
        Path(path).write_text(text)
        os.chmod(path, 0o666)
    return t, run


async def test_a_local_fetch_is_private_under_any_umask(tmp_path: Path, open_umask: None) -> None:
    t, run = _node_run(tmp_path / "home")
    logs = tmp_path / "mscon-runs" / "r1"
    logs.mkdir(parents=True, mode=0o755)  # the run folder, as the recording made it under umask 022
    got = await t.fetch_run_dir(
        str(run), str(logs / "node1"), logs_root=str(logs), include=(layout.CHECKPOINT_DIR,)
    )
    assert got > 0
    copied = logs / "node1"
    assert (copied / layout.JOURNAL).read_text() == '{"attempt": 0}\n'
    assert (copied / layout.CHECKPOINT_DIR / "rank_0" / "step_3.ckpt").read_text() == "the weights"
    assert not_private(logs) == []
    # The folders it made above the run folder are 0700 as well (none existed but the run's).
    fresh = tmp_path / "elsewhere" / "runs"
    await t.fetch_run_dir(str(run), str(fresh / "r1" / "node1"))
    assert not_private(tmp_path / "elsewhere") == []


async def test_a_fetch_again_tightens_and_never_writes_through_a_link(
    tmp_path: Path, open_umask: None
) -> None:
    t, run = _node_run(tmp_path / "home")
    logs = tmp_path / "logs"
    copied = logs / "node1"
    old_attempt = Path(layout.attempt_folder(copied, 0))
    old_attempt.mkdir(parents=True, mode=0o777)  # an earlier copy, made by an older mscon
    victim = tmp_path / "victim.txt"
    victim.write_text("not the node's\n")
    victim.chmod(0o644)
    Path(layout.log_file(old_attempt, "r0")).symlink_to(victim)  # a link where a log goes
    await t.fetch_run_dir(str(run), str(copied), logs_root=str(logs))
    assert victim.read_text() == "not the node's\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    log = Path(layout.log_file(old_attempt, "r0"))
    assert not log.is_symlink() and log.read_text() == "step 1\n"
    assert not_private(logs) == []


def _tar(entries: list[tuple[str, int, bytes | None]]) -> io.BytesIO:
    """A gzip tar as the Slurm node's agent sends one: (name, mode, data or None for a folder)."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, mode, data in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    raw.seek(0)
    return raw


def test_a_slurm_fetch_unpacks_private_under_any_umask(tmp_path: Path, open_umask: None) -> None:
    dest = tmp_path / "logs" / "node1"
    dest.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("not the node's\n")
    (dest / "journal.jsonl").symlink_to(victim)
    buf = _tar(
        [
            ("attempt_0", 0o777, None),
            ("attempt_0/r0.log", 0o666, b"step 1\n"),
            ("checkpoints/rank_0/step_3.ckpt", 0o666, b"the weights"),  # its folders not listed first
            ("journal.jsonl", 0o666, b"{}\n"),
        ]
    )
    total = slurm._extract(buf, dest, frozenset())
    assert total == len(b"step 1\n") + len(b"the weights") + len(b"{}\n")
    assert (dest / "checkpoints" / "rank_0" / "step_3.ckpt").read_bytes() == b"the weights"
    assert victim.read_text() == "not the node's\n" and not (dest / "journal.jsonl").is_symlink()
    assert not_private(dest) == []


async def test_the_runs_recording_is_private_under_any_umask(tmp_path: Path, open_umask: None) -> None:
    run_folder = tmp_path / "mscon-runs" / "r1"
    rec = CompressedRecorder(run_folder / "events.jsonl.gz")
    rec.close()
    assert not_private(tmp_path / "mscon-runs") == []


def _raise(ev: Event) -> None:
    raise ZeroDivisionError("a view's bug")


async def test_what_the_console_writes_into_a_run_folder_is_private_under_any_umask(
    tmp_path: Path, open_umask: None
) -> None:
    """summary.json, console.err, engine-error.txt and the detach record: 0600 in a 0700 run
    folder, though umask 0 would leave them 0666/0777 (as before issue 33's console side)."""
    run = tmp_path / "runs" / "r1"
    bus = EventBus(run)
    broken = bus.add_sink("broken", _raise)
    bus.publish(AgentEvent(0, P.LogBatch("n1", "r0", 0, 0, ("line",), 0)))
    await until(lambda: broken.detached is not None, 10, "the raising sink detached")
    await bus.close()
    result = RunResult("r1", JobState.SUCCEEDED, 0, "every rank succeeded", None, (), 1.0, str(run))
    write_summary(summary_file(run), result)
    write_record(run, DetachRecord("r1", "inv.yaml", "train.py", (), 0))
    try:
        raise RuntimeError("an internal error")
    except RuntimeError:
        save_traceback(run)
    names = sorted(p.name for p in run.iterdir())
    assert names == sorted([CONSOLE_ERR, "engine-error.txt", RECORD, "summary.json"]), names
    assert "ZeroDivisionError" in (run / CONSOLE_ERR).read_text()
    assert not not_private(tmp_path / "runs"), not_private(tmp_path / "runs")


def test_files_made_under_another_umask_are_tightened_when_rewritten(
    tmp_path: Path, open_umask: None
) -> None:
    run = tmp_path / "r1"
    run.mkdir(mode=0o777)
    for name in ("summary.json", RECORD, CONSOLE_ERR):
        (run / name).write_text("{}")
        os.chmod(run / name, 0o666)
    write_json(summary_file(run), {"status": "succeeded"})
    write_record(run, DetachRecord("r1", "inv.yaml", "train.py", (), 0))
    bus = EventBus(run)
    assert bus.error_log is not None
    private_text(bus.error_log, "a traceback\n", append=True)
    assert (run / CONSOLE_ERR).read_text() == "{}a traceback\n"  # appended, not replaced
    assert not not_private(run), not_private(run)


def test_json_to_a_pipe_is_written_and_the_pipe_left_alone(tmp_path: Path, open_umask: None) -> None:
    """--json may name a FIFO (or /dev/stdout): written through, its mode never changed; and a
    folder of the operator's it lies in is not made 0700."""
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    fifo = out / "summary.fifo"
    os.mkfifo(fifo, 0o644)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_json(fifo, {"status": "succeeded"})
    reader.join(10)
    assert got and b'"succeeded"' in got[0]
    assert stat.S_IMODE(fifo.stat().st_mode) == 0o644
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    write_json(out / "new" / "s.json", {"a": 1})  # a missing folder: made 0700, the file 0600
    assert not not_private(out / "new"), not_private(out / "new")
