"""Incremental readers for the files ranks write: the log (lines) and MSCON_METRICS (JSON lines);
LineMetrics, the metrics in the log lines of unmodified scripts."""

from __future__ import annotations

import json
import re
from typing import NamedTuple

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

    @property
    def consumed(self) -> int:
        """Bytes up to the end of the last whole line returned."""
        return self.offset - len(self._partial)


def _clean(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if len(text) > _MAX_LINE:
        text = text[:_MAX_LINE] + " [mscon: line cut]"
    return text


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


# ---------------------------------------------------------------------------------------------
# Metrics from unmodified scripts: LineMetrics recognises the loss/step-time lines that MindSpore's
# own callbacks, MindFormers and the common tutorials print.

NO_STEP = -1
"""ParsedMetric.step of a step-time-only result (TimeMonitor): the line has no step number."""


class ParsedMetric(NamedTuple):
    """One metric parsed from a log line.

    ``step`` and ``epoch`` are the numbers as printed: MindSpore's LossMonitor, MindFormers and the
    ``Epoch [e/E], Step [s/S]`` tutorials print the step *within the epoch*, so order by (epoch, step).
    A TimeMonitor line gives ``step == NO_STEP`` (-1) with only ``step_time_s`` set: it times the most
    recent step(s) of the same rank and carries no step number of its own.
    """

    step: int
    loss: float | None
    epoch: int | None
    step_time_s: float | None


_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NANINF = r"[-+]?(?:nan|inf(?:inity)?)"
# A loss as printed: a Python/numpy float, `[0.61]` (a 1-element Tensor's str), MindSpore's Tensor
# repr `Tensor(shape=[], dtype=Float32, value= 0.61)`, or numpy 2's `np.float32(0.61)`. Not
# MindSpore's own "loss is NAN or INF, training process cannot continue" (which value is unknown).
_VALUE = (
    r"(?:Tensor\(\s*shape=\[[^\]]*\],\s*dtype=\w+,\s*value=\s*)?(?:np\.float\d*\()?\[*\s*"
    r"(?P<loss>" + _NUM + "|" + _NANINF + r")(?!\w)(?!\s*or\s)"
)
# LossMonitor `epoch: 1 step: 20, loss is 0.69` (and `epoch: 0, step: 10, loss is ...`), MindFormers
# `{ Epoch:[  1/  2], step:[    1/  125], loss: 10.553, ...` (also `loss:[10.553/10.601]`, the
# running mean after the slash), tutorials' `Epoch [1/10], Step [100/600], Loss: 0.1234`.
_EPOCH_STEP_LOSS = re.compile(
    r"\bepoch\s*:?\s*\[?\s*(?P<epoch>\d+)(?:\s*/\s*\d+)?\s*\]?\s*,?\s*"
    r"step\s*:?\s*\[?\s*(?P<step>\d+)(?:\s*/\s*\d+)?\s*\]?\s*,?\s*"
    r"loss(?:\s+is\b|\s*[:=])\s*" + _VALUE,
    re.IGNORECASE,
)
# MindSpore's quick-start tutorial: `loss: 2.302585  [  0/938]` (batch index within the epoch).
_QUICKSTART = re.compile(
    r"\bloss:\s*(?P<loss>" + _NUM + "|" + _NANINF + r")\s+\[\s*(?P<step>\d+)\s*/\s*\d+\s*\]"
)
_VALUE_RE = re.compile(_VALUE, re.IGNORECASE)
# MindFormers: `per_step_time: 1234ms`.
_PER_STEP_TIME = re.compile(r"per_step_time:\s*(" + _NUM + r")\s*ms")
_STEP_TIME = re.compile(r"per step time:\s*(" + _NUM + r")\s*ms")


def _loss_value(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        m = _VALUE_RE.search(text)
        return float(m.group("loss")) if m else None


class LineMetrics:
    """Metrics from the log lines of unmodified training scripts.

    ``parse(line)`` returns a ParsedMetric or None. Recognised, in this order:

    1. ``pattern``, the user's regex (named groups ``step``, ``loss``, optional ``epoch``), searched
       anywhere in the line; a pattern that does not compile, or has no ``step`` group, is ignored.
    2. ``epoch``/``step``/``loss`` lines: MindSpore LossMonitor (``epoch: 1 step: 20, loss is 0.69``),
       MindFormers (``{ Epoch:[  1/  2], step:[    1/  125], loss: 10.553, per_step_time: 1234ms,
       ...}``, which also gives step_time_s), ``Epoch [1/10], Step [100/600], Loss: 0.1234``.
    3. MindSpore's quick-start ``loss: 2.302585  [  0/938]`` (epoch None).
    4. TimeMonitor ``epoch time: 1234.5 ms, per step time: 12.345 ms``: ``step == NO_STEP``.

    Any prefix (``[INFO]``, timestamps, logger names) is allowed; nan/inf losses parse to float
    nan/inf. Lines without "oss"/"OSS" or "step time" are rejected by substring tests before any
    regex runs, so the built-in formats cost almost nothing on other lines; a user pattern is
    searched in every line.
    """

    def __init__(self, pattern: str | None = None) -> None:
        self._user: re.Pattern[str] | None = None
        if pattern:
            try:
                compiled = re.compile(pattern)
            except re.error:
                compiled = None
            if compiled is not None and "step" in compiled.groupindex:
                self._user = compiled

    def candidates(self, lines: list[str], text: str | None = None) -> list[str]:
        """The lines ``parse`` may recognise, in order: all of them with a user pattern, else only
        those with "oss"/"OSS" or "step time". ``text`` is the lines joined by newlines (where the
        caller has it): one substring test of the whole chunk rules out most chunks at once."""
        if self._user is not None:
            return lines
        if text is None:
            text = "\n".join(lines)
        if "oss" not in text and "OSS" not in text and "step time" not in text:
            return []
        return [line for line in lines if "oss" in line or "OSS" in line or "step time" in line]

    def parse(self, line: str) -> ParsedMetric | None:
        if self._user is not None:
            parsed = self._parse_user(line)
            if parsed is not None:
                return parsed
        if "oss" in line or "OSS" in line:
            m = _EPOCH_STEP_LOSS.search(line)
            if m is not None:
                step_time = None
                if "per_step_time" in line:
                    t = _PER_STEP_TIME.search(line, m.end())
                    if t is not None:
                        step_time = float(t.group(1)) / 1000.0
                return ParsedMetric(
                    int(m.group("step")), float(m.group("loss")), int(m.group("epoch")), step_time
                )
            m = _QUICKSTART.search(line)
            if m is not None:
                return ParsedMetric(int(m.group("step")), float(m.group("loss")), None, None)
        if "step time" in line:
            m = _STEP_TIME.search(line)
            if m is not None:
                return ParsedMetric(NO_STEP, None, None, float(m.group(1)) / 1000.0)
        return None

    def _parse_user(self, line: str) -> ParsedMetric | None:
        assert self._user is not None
        m = self._user.search(line)
        if m is None:
            return None
        groups = m.groupdict()
        try:
            step = int(groups["step"])
            epoch = int(groups["epoch"]) if groups.get("epoch") is not None else None
        except (TypeError, ValueError):
            return None
        return ParsedMetric(step, _loss_value(groups.get("loss")), epoch, None)
