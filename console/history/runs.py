"""The runs this console started, as their run folders under the logs dir (``./mscon-runs``) keep them.

A run folder's ``summary.json`` says how the run ended. A folder with none (a console that died
mid-run) is read from its recording instead: a console still recording it is a run going on, else
the run's end is unknown. ``mscon ls`` lists them; ``mscon replay RUN_ID`` finds a recording here.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mscon.console.config.safepath import UnsafePath, label
from mscon.console.detach.record import read_record
from mscon.console.engine.events import Failure, JobState, RunFinished, RunResult, dump, result_from_json
from mscon.console.engine.root_cause import describe
from mscon.console.engine.state import ClusterState
from mscon.console.engine.summary import summary_file
from mscon.console.history.recording import being_recorded, read_recording, recording_file, recording_started
from mscon.console.views.plain import elapsed, printable, size

UNKNOWN = "unknown"  # the status of a run whose console ended before it wrote a summary


@dataclass(frozen=True)
class PastRun:
    run_id: str
    folder: Path
    status: JobState | None  # None: unknown (no summary, and no console records it any more)
    attempts: int
    root_cause: Failure | None  # of a failed run: which rank failed first, and how
    reason: str  # how the run ended, in words ("" where unknown)
    wall_s: float | None
    started: float | None  # seconds since the epoch
    size: int  # bytes on disk, the whole folder
    recorded: bool  # it has a recording: ``mscon replay RUN_ID`` opens it

    @property
    def status_word(self) -> str:
        return UNKNOWN if self.status is None else self.status.value

    @property
    def cause(self) -> str:
        """The root cause of a failed run (rank and reason), else how it ended."""
        return describe(self.root_cause) if self.root_cause is not None else self.reason

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "folder": str(self.folder.absolute()),
            "status": self.status_word,
            "attempts": self.attempts,
            "root_cause": dump(self.root_cause),
            "cause": self.cause,
            "reason": self.reason,
            "wall_s": self.wall_s,
            "started": self.started,
            "size_bytes": self.size,
            "recording": str(recording_file(self.folder.absolute())) if self.recorded else None,
        }


def past_runs(logs_root: Path) -> list[PastRun]:
    """Every run folder under ``logs_root``, newest first (none if the folder does not exist)."""
    try:
        folders = [e for e in os.scandir(logs_root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    runs = [r for r in (read_run(Path(e.path)) for e in folders) if r is not None]
    runs.sort(key=lambda r: (r.started or 0.0, r.run_id), reverse=True)
    return runs


def read_run(folder: Path) -> PastRun | None:
    """The run a folder holds, or None where it holds no run (no summary, recording or detach record)."""
    summary, recording = summary_file(folder), recording_file(folder)
    recorded = recording.is_file()
    started = recording_started(recording) if recorded else None
    result = _summary(summary)
    if result is None and recorded:  # an empty one (a console dead in its first second): the file's time
        return _from_recording(folder, recording, started or _mtime(recording) or None)
    if result is None:
        record = read_record(folder)  # detached, and its summary lost
        if record is None:
            return None
        result = RunResult(record.run_id, JobState.DETACHED, 0, "detached", None, (), 0.0, str(folder))
    if started is None:  # no recording: the summary was written as the run ended
        ended = _mtime(summary if summary.is_file() else folder)
        started = ended - result.wall_s if ended else None
    return PastRun(
        run_id=folder.name,
        folder=folder,
        status=result.status,
        attempts=len(result.attempts),
        root_cause=result.root_cause if result.status is JobState.FAILED else None,
        reason=result.reason,
        wall_s=result.wall_s,
        started=started,
        size=folder_size(folder),
        recorded=recorded,
    )


def _summary(path: Path) -> RunResult | None:
    try:
        return result_from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _from_recording(folder: Path, recording: Path, started: float | None) -> PastRun:
    """A run with no summary, rebuilt from its recording as a replay would (ClusterState)."""
    state = ClusterState()
    finished: RunResult | None = None
    try:
        for ev in read_recording(recording):
            state.apply(ev)
            if isinstance(ev, RunFinished):
                finished = ev.result
    except (OSError, ValueError, TypeError, KeyError):
        pass  # what was read is what there is
    live = being_recorded(recording)
    last = _mtime(recording)
    root = None
    if finished is not None:  # its summary could not be written
        status: JobState | None = finished.status
        reason = finished.reason
        root = finished.root_cause if status is JobState.FAILED else None
    elif live:
        status, reason = JobState.RUNNING, ""
    else:  # what had failed when its console died, as the console saw it
        status, reason = None, "the console ended before the run did (no summary)"
        root = state.root_cause()
    return PastRun(
        run_id=folder.name,
        folder=folder,
        status=status,
        attempts=len(finished.attempts) if finished is not None else len(state.attempts),
        root_cause=root,
        reason=reason,
        wall_s=finished.wall_s if finished is not None else (last - started if started and last else None),
        started=started,
        size=folder_size(folder),
        recorded=True,
    )


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def folder_size(folder: Path) -> int:
    """Bytes the files under ``folder`` take (links not followed, unreadable parts skipped)."""
    total = 0
    for entry in _walk(folder):
        try:
            total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


def _walk(folder: Path) -> Iterator[os.DirEntry[str]]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            yield from _walk(Path(e.path))
        else:
            yield e


# ------------------------------------------------------------------ mscon replay RUN_ID


class NoRecording(Exception):
    """``mscon replay X``: X is neither a recording nor a run with one (the message says which)."""


def find_recording(target: str, logs_root: Path) -> Path:
    """What ``mscon replay TARGET`` opens: TARGET itself if it is a file, else the recording of the
    run TARGET under ``logs_root``; NoRecording with a one-line message otherwise."""
    given = Path(target)
    if given.is_file():
        return given
    try:
        label(target, "run id")
    except UnsafePath:
        raise NoRecording(f"{target}: no such file") from None
    folder = logs_root / target
    shown = logs_root.as_posix() if logs_root.is_absolute() else f"./{logs_root.as_posix()}"
    if not folder.is_dir():
        raise NoRecording(f"no run {target}: not a file nor a run in {shown} (mscon ls lists runs)")
    recording = recording_file(folder)
    if not recording.is_file():
        raise NoRecording(f"run {target} has no recording ({recording} does not exist)")
    return recording


# ------------------------------------------------------------------ mscon ls


def format_past_runs(runs: list[PastRun], logs_root: Path) -> str:
    """One row per run, newest first: what ``mscon ls`` prints with no inventory."""
    if not runs:
        return f"no runs in {logs_root}"
    rows = [("RUN", "STATUS", "ATTEMPTS", "DURATION", "STARTED", "SIZE", "ROOT CAUSE / REASON")]
    for r in runs:
        rows.append(
            (
                printable(r.run_id),
                r.status_word,
                str(r.attempts),
                _duration(r.wall_s),
                _when(r.started),
                size(r.size),
                printable(r.cause)[:80],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _duration(wall_s: float | None) -> str:
    if wall_s is None:
        return "-"
    return f"{wall_s:.1f}s" if wall_s < 60 else elapsed(wall_s)


def _when(started: float | None) -> str:
    if started is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(started))
