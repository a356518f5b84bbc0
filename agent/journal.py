"""What a node keeps of a run in its run folder, so a console can attach later and learn all of it.

- ``journal.jsonl``: every lifecycle message the agent sent (process started and exited, hangs,
  evidence, errors, the coordinator's decisions), one JSON line each, with its attempt. Logs are
  not copied here: they are in ``attempt_N/<name>.log`` already and are replayed from there.
- ``state.json``: the run as this node sees it now (attempt, status, pids, who is attached),
  rewritten atomically; ``mscon ls`` reads it even when no agent runs any more.

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import json
import os
import time

from .tail import _clean

JOURNAL = "journal.jsonl"
STATE = "state.json"
SOCKET = "agent.sock"  # bound relative to the run folder: absolute paths may pass the 107-byte limit
ERRORS = "agent.err"  # the daemon's stderr once no console holds it

# The messages worth keeping: what a console needs to rebuild the run. Logs, metrics and telemetry
# are not journaled (the log files hold the lines; the last metric of each rank is in state.json).
JOURNALED = frozenset(
    ["proc_started", "proc_exited", "proc_hung", "all_exited", "agent_error", "evidence", "coord"]
)


class RunStatus:
    """state.json's ``status`` (plain strings: stdlib JSON on both sides)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"  # the agent died without recording an end (read by `mscon ls`, never written)


class Journal:
    """Append-only; each entry is flushed at once so a killed agent loses nothing it reported."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, JOURNAL)
        self.count = 0
        if os.path.exists(self.path):  # an agent restarted on the same run folder goes on counting
            with open(self.path, "rb") as f:
                self.count = sum(1 for _ in f)
        self._f = open(self.path, "a", encoding="utf-8")

    def add(self, attempt: int, msg: dict) -> int:
        index = self.count
        self._f.write(json.dumps({"i": index, "a": attempt, "m": msg}, separators=(",", ":")) + "\n")
        self._f.flush()
        self.count += 1
        return index

    def close(self) -> None:
        self._f.close()


def read_journal(run_dir: str, start: int = 0):  # noqa: ANN201 - a generator of (index, attempt, dict)
    path = os.path.join(run_dir, JOURNAL)
    try:
        f = open(path, encoding="utf-8")
    except OSError:
        return
    with f:
        for i, line in enumerate(f):
            if i < start:
                continue
            try:
                entry = json.loads(line)
                yield int(entry["i"]), int(entry["a"]), dict(entry["m"])
            except (ValueError, KeyError, TypeError):
                return  # a torn last line (the agent was killed mid-write): the journal ends there


def write_state(run_dir: str, state: dict) -> None:
    state = dict(state, updated=time.time())
    tmp = os.path.join(run_dir, ".%s.tmp" % STATE)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, sort_keys=True)
    os.replace(tmp, os.path.join(run_dir, STATE))


def read_state(run_dir: str) -> dict | None:
    try:
        with open(os.path.join(run_dir, STATE), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def log_lines(path: str, start: int, stop: int | None = None, checkpoint: tuple = (0, 0)):  # noqa: ANN201
    """Lines ``start`` .. ``stop`` (exclusive; None: to the end, a last unterminated line included)
    of a rank's log, split and cleaned exactly as FileTail does, in lists of at most 500.

    ``checkpoint`` is a known (line number, byte offset) at or before ``start``: reading begins
    there instead of at the top of a large file.
    """
    seq, offset = checkpoint if checkpoint[0] <= start else (0, 0)
    try:
        f = open(path, "rb")
    except OSError:
        return
    with f:
        f.seek(offset)
        pending = b""
        batch: list = []
        while stop is None or seq < stop:
            chunk = f.read(1 << 20)
            if not chunk:
                if stop is None and pending:
                    if seq >= start:
                        batch.append(_clean(pending))
                    seq += 1
                break
            parts = (pending + chunk).split(b"\n")
            pending = parts.pop()
            for raw in parts:
                if stop is not None and seq >= stop:
                    break
                if seq >= start:
                    batch.append(_clean(raw))
                    if len(batch) >= 500:
                        yield batch
                        batch = []
                seq += 1
        if batch:
            yield batch


def runs_root(cache: str | None) -> str:
    """Where runs are kept: under the cache folder the console gave (the one its transport built
    every run folder in, whatever $HOME says), else ~/.cache/mscon."""
    return os.path.join(cache or os.path.join(os.path.expanduser("~"), ".cache", "mscon"), "runs")


def run_folder(cache: str | None, run_id: str, node: str) -> str:
    """The node's folder of a run, as the console's transport computes it (both names are plain)."""
    for value in (run_id, node):
        if not value or value in (".", "..") or "/" in value or "\0" in value:
            raise ValueError("not a plain name: %r" % value)
    return os.path.join(runs_root(cache), run_id, node)
