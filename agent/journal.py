"""What a node keeps of a run in its run folder, so a console can attach later and learn all of it.

- ``journal.jsonl``: every lifecycle message the agent sent (process started and exited, hangs,
  evidence, errors, the coordinator's decisions: the classes marked ``journaled`` in
  protocol.py), one JSON line each, with its attempt. Logs are
  not copied here: they are in ``attempt_N/<name>.log`` already and are replayed from there.
- ``state.json``: the run as this node sees it now (attempt, status, pids, who is attached),
  rewritten atomically; ``mscon ls`` reads it even when no agent runs any more.

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import json
import os
import time

from .layout import STATE, journal_file, private_open, state_file
from .policy import Status
from .tail import _clean


class RunStatus:
    """state.json's ``status`` (plain strings: stdlib JSON on both sides); a run's end in the
    policy's words (policy.Status)."""

    RUNNING = "running"
    SUCCEEDED = Status.SUCCEEDED.value
    FAILED = Status.FAILED.value
    INTERRUPTED = Status.INTERRUPTED.value
    LOST = "lost"  # the agent died without recording an end (read by `mscon ls`, never written)


class Journal:
    """Append-only; each entry is flushed at once so a killed agent loses nothing it reported."""

    def __init__(self, run_dir: str) -> None:
        self.path = journal_file(run_dir)
        self.count = 0
        if os.path.exists(self.path):  # an agent restarted on the same run folder goes on counting
            with open(self.path, "rb") as f:
                self.count = sum(1 for _ in f)
        self._f = private_open(self.path, "a", encoding="utf-8")

    def add(self, attempt: int, msg: dict) -> int:
        index = self.count
        self._f.write(json.dumps({"i": index, "a": attempt, "m": msg}, separators=(",", ":")) + "\n")
        self._f.flush()
        self.count += 1
        return index

    def close(self) -> None:
        self._f.close()


def read_journal(run_dir: str, start: int = 0):  # noqa: ANN201 - a generator of (index, attempt, dict)
    try:
        f = open(journal_file(run_dir), encoding="utf-8")
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
    with private_open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, sort_keys=True)
    os.replace(tmp, state_file(run_dir))


def read_state(run_dir: str) -> dict | None:
    try:
        with open(state_file(run_dir), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def agent_alive(state: dict) -> bool:
    """The process state.json names (the run's agent, or its detached coordinator) still exists.
    A reused pid reads as alive: what relies on this only ever keeps more, never kills."""
    pid = state.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
