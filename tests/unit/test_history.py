"""Run history: every run's recording in its folder (gzip JSON lines, readable after a crash),
``mscon ls`` over the past runs of a logs folder, ``mscon replay RUN_ID``, and unknown run ids."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import secrets
import shutil
import time
from pathlib import Path

import pytest
from conftest import local_inventory, mscon, until
from mscon.agent import layout
from mscon.agent.protocol import LogBatch, ProcExited, ProcStarted
from mscon.console.cli.main import main
from mscon.console.engine.bus import EventBus
from mscon.console.engine.events import (
    AgentEvent,
    AttemptStarted,
    Event,
    Failure,
    FailureKind,
    JobState,
    RankRef,
    RunFinished,
    RunResult,
    RunStarted,
    to_json,
)
from mscon.console.engine.summary import summary_file, write_summary
from mscon.console.history.recording import (
    RECORDING,
    CompressedRecorder,
    RunRecorders,
    being_recorded,
    read_recording,
    recording_file,
    recording_started,
)
from mscon.console.history.runs import NoRecording, find_recording, folder_size, past_runs


def _events(run_id: str, n_logs: int = 50, finished: bool = True) -> list[Event]:
    ranks = (RankRef("r0", "node-a", 0), RankRef("r1", "node-b", 1))
    evs: list[Event] = [
        RunStarted(0, run_id, "inv.yaml", ("node-a", "node-b"), 2, f"/x/{run_id}"),
        AttemptStarted(0, ranks, "node-a", 8118, ts_ns=1),
    ]
    for r in ranks:
        evs.append(AgentEvent(0, ProcStarted(r.node, r.name, r.rank, 100 + r.rank, 10, "log")))
    for i in range(n_logs):
        line = f"epoch: 1 step: {i}, loss is 2.{i}"
        evs.append(AgentEvent(0, LogBatch("node-a", "r0", 0, i, (line,), 20 + i)))
    evs.append(AgentEvent(0, ProcExited("node-b", "r1", 1, 101, 7, None, None, 10_000, False)))
    if finished:
        result = RunResult(run_id, JobState.FAILED, 7, "r1 failed", None, (), 1.5, f"/x/{run_id}")
        evs.append(RunFinished(0, result))
    return evs


async def _record(path: Path, events: list[Event], close: bool = True, flush_s: float = 1.0) -> None:
    """Publish ``events`` on a bus with the recorder as its sink, as a run does."""
    bus = EventBus()
    rec = CompressedRecorder(path, flush_s=flush_s)
    bus.add_sink("history", rec.handle, lag_limit=10**9, hard_limit=10**9, busy=rec.busy)
    for ev in events:
        bus.publish(ev)
    await bus.close()
    if close:
        rec.close()


def _as_json(events: list[Event]) -> list[object]:
    return [to_json(e) for e in events]


def test_the_recording_holds_every_event_compressed(tmp_path: Path) -> None:
    events = _events("rec-1", n_logs=2000)
    path = recording_file(tmp_path / "rec-1")
    assert path.name == RECORDING
    asyncio.run(_record(path, events))
    raw = path.read_bytes()
    plain = b"".join(json.dumps(j, separators=(",", ":")).encode() + b"\n" for j in _as_json(events))
    assert gzip.decompress(raw) == plain  # the records of --events, as gzip reads them
    assert len(raw) * 5 < len(plain)
    assert _as_json(list(read_recording(path))) == _as_json(events)
    started = recording_started(path)
    assert started is not None and abs(started - time.time()) < 60
    assert not being_recorded(path)


def test_a_recording_cut_short_reads_up_to_its_last_whole_line(tmp_path: Path) -> None:
    """A console that died: the stream is flushed as it goes, so what reached the disk reads back."""
    events = _events("crash", n_logs=300, finished=False)
    path = tmp_path / "crash" / RECORDING

    async def crash() -> bytes:
        rec = CompressedRecorder(path, flush_s=0.0)  # every event flushed, as after a second of a run
        bus = EventBus()
        bus.add_sink("history", rec.handle, lag_limit=10**9, hard_limit=10**9, busy=rec.busy)
        for ev in events:
            bus.publish(ev)
        await bus.close()
        assert being_recorded(path)  # the recorder's lock: a run going on
        data = path.read_bytes()  # no gzip trailer: the console never closed it
        rec.close()
        return data

    data = asyncio.run(crash())
    with pytest.raises(EOFError):
        gzip.decompress(data)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(data)
    assert _as_json(list(read_recording(cut))) == _as_json(events)
    whole = _as_json(events)
    for size in (10, 200, len(data) // 3, len(data) // 2, len(data) - 7):
        cut.write_bytes(data[:size])
        got = _as_json(list(read_recording(cut)))
        assert got == whole[: len(got)]  # a prefix, never an error or a broken event
    cut.write_bytes(data[: len(data) // 2])
    assert 0 < len(list(read_recording(cut))) < len(events)


def test_a_quiet_spell_still_brings_what_is_buffered_to_the_disk(tmp_path: Path) -> None:
    """No event after the last ones: the recorder's own timer flushes them (a console that then
    dies loses nothing of them)."""
    path = tmp_path / RECORDING
    events = _events("quiet", n_logs=3, finished=False)

    async def quiet() -> int:
        rec = CompressedRecorder(path, flush_s=0.2)
        bus = EventBus()
        bus.add_sink("history", rec.handle, lag_limit=10**9, hard_limit=10**9, busy=rec.busy)
        for ev in events:
            bus.publish(ev)

        def on_disk() -> int:
            return len(list(read_recording(path))) if path.stat().st_size else 0

        await until(lambda: on_disk() == len(events), 10, "every event in the recording")
        await bus.close()
        rec.close()
        return on_disk()

    assert asyncio.run(quiet()) == len(events)


def test_a_plain_events_file_still_reads_and_a_cut_last_line_is_dropped(tmp_path: Path) -> None:
    events = _events("plain", n_logs=3)
    lines = [json.dumps(j) for j in _as_json(events)]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert _as_json(list(read_recording(path))) == _as_json(events)
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:30])
    assert _as_json(list(read_recording(path))) == _as_json(events[:-1])
    path.write_text("not json\n" + lines[0] + "\n")
    with pytest.raises(ValueError):
        list(read_recording(path))


def test_run_recorders_write_the_history_and_the_events_file(tmp_path: Path) -> None:
    events = _events("both", n_logs=5)

    async def run() -> None:
        bus = EventBus()
        rec = RunRecorders(bus, tmp_path / "runs" / "both", tmp_path / "events.jsonl")
        for ev in events:
            bus.publish(ev)
        await bus.close()
        rec.close()

    asyncio.run(run())
    assert _as_json(list(read_recording(tmp_path / "runs" / "both" / RECORDING))) == _as_json(events)
    assert (tmp_path / "events.jsonl").read_bytes()[:1] == b"{"  # --events stays plain JSON lines
    assert _as_json(list(read_recording(tmp_path / "events.jsonl"))) == _as_json(events)


# ------------------------------------------------------------------ mscon ls


def _crashed(folder: Path, events: list[Event]) -> Path:
    """A run folder as a console that died mid-run leaves it: a recording (no trailer), no summary."""
    scratch = folder.parent / f".{folder.name}.recording"
    asyncio.run(_record(scratch, events, close=False, flush_s=0.0))
    folder.mkdir(parents=True)
    recording_file(folder).write_bytes(scratch.read_bytes())  # unlocked: its console is gone
    scratch.unlink()
    return folder


def _summary_run(root: Path, run_id: str, result: RunResult, ended: float, payload: int) -> Path:
    folder = root / run_id
    (folder / "node-a" / "attempt_0").mkdir(parents=True)
    (folder / "node-a" / "attempt_0" / "r0.log").write_bytes(b"x" * payload)
    write_summary(summary_file(folder), result)
    os.utime(summary_file(folder), (ended, ended))
    return folder


def _failure() -> Failure:
    return Failure(FailureKind.SIGNAL, "node-b", "r3", 3, 5, "agent on node-b", 137, "killed by SIGKILL")


def _fake_runs(root: Path) -> dict[str, Path]:
    now = time.time()
    ok = RunResult("ok-run", JobState.SUCCEEDED, 0, "all ranks finished", None, (), 62.0, "/x")
    failed = RunResult(
        "failed-run", JobState.FAILED, 137, "r3 on node-b failed first", _failure(), (), 12.5, "/x"
    )
    unreachable = RunResult(
        "far-run", JobState.UNREACHABLE, 4, "node-b: ssh: unreachable", None, (), 3.0, "/x"
    )
    folders = {
        "ok-run": _summary_run(root, "ok-run", ok, now - 3000, 100_000),
        "failed-run": _summary_run(root, "failed-run", failed, now - 2000, 2_000_000),
        "far-run": _summary_run(root, "far-run", unreachable, now - 1000, 10),
    }
    folders["crashed-run"] = _crashed(root / "crashed-run", _events("crashed-run", finished=False))
    (root / "not-a-run").mkdir()  # no summary, no recording: not listed
    (root / "stray.txt").write_text("x")
    return folders


def test_ls_lists_past_runs_newest_first_with_sizes_and_root_causes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = _fake_runs(tmp_path / "mscon-runs")
    monkeypatch.chdir(tmp_path)
    assert main(["ls"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == "RUN STATUS ATTEMPTS DURATION STARTED SIZE ROOT CAUSE / REASON".split()
    assert [line.split()[0] for line in out[1:]] == ["crashed-run", "far-run", "failed-run", "ok-run"]
    rows = {line.split()[0]: line for line in out[1:]}
    assert " failed " in rows["failed-run"]
    assert "r3 on node-b failed first (killed by SIGKILL)" in rows["failed-run"]
    assert "12.5s" in rows["failed-run"] and "1.9 MiB" in rows["failed-run"]
    assert "succeeded" in rows["ok-run"] and "0:01:02" in rows["ok-run"] and "97.9 KiB" in rows["ok-run"]
    assert "unreachable" in rows["far-run"] and "node-b: ssh: unreachable" in rows["far-run"]
    # the crashed one, from its recording: status unknown, its root cause from the events
    assert " unknown " in rows["crashed-run"]
    assert "r1 on node-b failed first (exit code 7)" in rows["crashed-run"]
    assert main(["ls", "--json"]) == 0
    doc = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(doc) == set(folders)
    for run_id, folder in folders.items():
        files = [p for p in folder.rglob("*") if p.is_file()]
        assert doc[run_id]["size_bytes"] == sum(p.stat().st_size for p in files) == folder_size(folder)
    assert doc["failed-run"]["root_cause"]["name"] == "r3" and doc["failed-run"]["status"] == "failed"
    assert doc["crashed-run"]["status"] == "unknown" and doc["crashed-run"]["attempts"] == 1
    assert doc["crashed-run"]["recording"] == str(folders["crashed-run"].absolute() / RECORDING)
    assert doc["ok-run"]["recording"] is None and doc["ok-run"]["wall_s"] == 62.0


def test_a_run_still_recorded_by_a_console_is_running(tmp_path: Path) -> None:
    async def live() -> None:
        rec = CompressedRecorder(tmp_path / "live" / RECORDING, flush_s=0.0)
        bus = EventBus()
        bus.add_sink("history", rec.handle, lag_limit=10**9, hard_limit=10**9, busy=rec.busy)
        for ev in _events("live", n_logs=3, finished=False):
            bus.publish(ev)
        await bus.close()
        [run] = past_runs(tmp_path)
        assert run.status is JobState.RUNNING and run.root_cause is None
        rec.close()
        [run] = past_runs(tmp_path)
        assert run.status is None and run.status_word == "unknown"

    asyncio.run(live())


def test_ls_of_no_runs_and_of_a_logs_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["ls"]) == 0
    assert capsys.readouterr().out == "no runs in mscon-runs\n"
    _fake_runs(tmp_path / "elsewhere")
    assert main(["ls", "--logs-dir", str(tmp_path / "elsewhere")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5


# ------------------------------------------------------------------ mscon replay RUN_ID


def test_replay_finds_a_run_by_id_and_refuses_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = _fake_runs(tmp_path)
    assert find_recording("crashed-run", tmp_path) == folders["crashed-run"] / RECORDING
    given = folders["crashed-run"] / RECORDING
    assert find_recording(str(given), tmp_path / "nowhere") == given  # a file is itself
    with pytest.raises(NoRecording, match="no recording"):
        find_recording("ok-run", tmp_path)
    for target, needle in (
        ("nope", "no run nope: not a file nor a run in"),
        ("ok-run", "run ok-run has no recording"),
        ("../x", "no such file"),
    ):
        assert main(["replay", target, "--logs-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.splitlines()) == 1, err
    # a run with a recording is read whole; only then does replay ask for a terminal
    assert main(["replay", "crashed-run", "--logs-dir", str(tmp_path)]) == 2
    assert "needs a terminal" in capsys.readouterr().err


# ------------------------------------------------------------------ unknown run ids


@pytest.mark.parametrize("command", ["attach", "stop", "logs"])
def test_unknown_run_id_is_one_line_and_starts_nothing(tmp_path: Path, command: str) -> None:
    done = mscon(command, "no-such-run", cwd=tmp_path, timeout=60)
    assert done.code == 2, done.err
    assert len(done.err.strip().splitlines()) == 1 and "no run no-such-run" in done.err, done.err
    assert done.out == ""
    assert not (tmp_path / "mscon-runs").exists()  # no run folder, no logs, nothing fetched
    assert not Path(layout.runs_root(), "no-such-run").exists()  # nor one on the (local) node


def test_a_real_run_leaves_a_recording_that_ls_and_replay_find(tmp_path: Path) -> None:
    fail = ["--steps", "5", "--rate", "0", "--fail-rank", "1", "--fail-step", "3"]
    inv = local_inventory(tmp_path / "inv.yaml", 2, "bench/fake_rank.py", fail)
    run_id = f"hist-{secrets.token_hex(3)}"  # a node keeps a run's folder: a fixed id runs once
    done = mscon("run", "--no-tui", "-q", inv, "--run-id", run_id, cwd=tmp_path)
    assert done.code == 3, done.err
    recording = find_recording(run_id, tmp_path / "mscon-runs")
    events = list(read_recording(recording))
    assert isinstance(events[0], RunStarted) and events[0].run_id == run_id
    assert isinstance(events[-1], RunFinished) and events[-1].result.status is JobState.FAILED
    listed = mscon("ls", "--json", cwd=tmp_path)
    [run] = json.loads(listed.out)
    assert run["run_id"] == run_id and run["status"] == "failed" and run["root_cause"]["name"] == "r1"
    assert run["size_bytes"] > recording.stat().st_size
    shutil.rmtree(tmp_path / "mscon-runs" / run_id / "local")  # what ls sizes is what is there
    [again] = json.loads(mscon("ls", "--json", cwd=tmp_path).out)
    assert again["size_bytes"] < run["size_bytes"]
