"""Incremental readers for the files ranks write: the log (lines) and MSCON_METRICS (JSON lines)."""

from __future__ import annotations

import json
import re

# MindSpore's LossMonitor: "epoch: 1 step: 20, loss is 0.6931"; TimeMonitor: "per step time: 12.3 ms".
LOSS_RE = re.compile(r"epoch:\s*(\d+)\s+step:\s*(\d+),\s*loss is\s*([-+0-9.eE]+|nan|inf|-inf)")
STEP_TIME_RE = re.compile(r"per step time:\s*([0-9.]+)\s*ms")

_MAX_LINE = 16 * 1024  # longer lines are cut so one runaway print cannot flood the console


class FileTail:
    """Reads whole lines appended to a file since the last call."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def read_lines(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                # While running, bounded reads keep messages small; at exit, read everything left.
                chunk = f.read() if final else f.read(4 * 1024 * 1024)
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        data = self._partial + chunk
        parts = data.split(b"\n")
        self._partial = parts.pop()
        if final and self._partial:
            parts.append(self._partial)
            self._partial = b""
        return [_clean(p) for p in parts]


def _clean(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if len(text) > _MAX_LINE:
        text = text[:_MAX_LINE] + " [mscon: line cut]"
    return text


def parse_loss_line(line: str) -> tuple | None:
    """(epoch, step, loss) from a LossMonitor-style line, else None."""
    m = LOSS_RE.search(line)
    if m is None:
        return None
    return (int(m.group(1)), int(m.group(2)), float(m.group(3)))


def parse_metrics_line(line: str) -> dict | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("step"), int):
        return None
    return obj


def extract_traceback(lines: list[str], limit: int = 60) -> str | None:
    """The last Python traceback printed, or the last MindSpore/Python error line."""
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            start = i
            break
    if start is not None:
        return "\n".join(lines[start : start + limit])
    for line in reversed(lines):
        if re.match(r"^\s*(\w+(Error|Exception)|\[(ERROR|CRITICAL)\])", line):
            return line
    return None
