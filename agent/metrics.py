"""Metric messages from what a rank writes: its MSCON_METRICS records, or its printed loss lines.

One place builds them, for the live tail (main.py) and for the replay an attaching console gets
(relay.py). Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import dataclasses
import json
import time

from . import protocol as P
from .tail import NO_STEP, LineMetrics


def from_record(node: str, name: str, rank: int, obj: dict, read_ts: float | None = None) -> P.Metric:
    """A Metric from one MSCON_METRICS JSON record (``tail.parse_metrics_line``): each optional
    field of Metric from the record's key of the same name, None where it is missing or of
    another type. ``ts`` is the record's own (the rank's clock), else ``read_ts``, the time the
    agent read it (one for all the lines of one read: the console derives no step time between
    them), else now."""
    return P.Metric(
        node=node,
        name=name,
        rank=rank,
        step=obj["step"],
        ts=_opt_float(obj.get("ts")) or read_ts or time.time(),
        source="metrics",
        **{field: read(obj.get(key)) for field, key, read in _RECORD_FIELDS},
    )


def phase_from_line(node: str, name: str, rank: int, line: str) -> P.RankPhase | None:
    """A RankPhase from an MSCON_METRICS line that is a phase record (``{"phase": "joined", "ts":
    1700000000.5}``, the rank's own clock); None for any other line. Only the milestones a rank
    records (``Milestone.RECORDED``) are taken: the first step is the agent's to say."""
    obj = _record(line, "phase")
    if obj is None or obj["phase"] not in P.Milestone.RECORDED:
        return None
    graph = obj.get("graph") if obj["phase"] == P.Milestone.COMPILED else None
    return P.RankPhase(
        node=node,
        name=name,
        rank=rank,
        phase=obj["phase"],
        ts_ns=_ts_ns(obj),
        graph=graph if graph in P.GraphSource.ALL else None,
    )


def resume_from_line(node: str, name: str, rank: int, line: str) -> P.RankResumed | None:
    """A RankResumed from an MSCON_METRICS line that is a resume record (``{"resume": {"step":
    150, "epoch": 3, "source": "snapshot"}, "ts": 1700000000.5}``, written once per attempt before
    the rank's first step); None for any other line, and for a record without a step (an int, 0 or
    more) or with a source not in ``ResumeSource.ALL``. An epoch that is not an int is dropped. A
    refusal (``"source": "refused"``) needs no step (it starts none: 0) and keeps its ``reason``
    (a string, else None), on one line and cut to ``RESUME_REASON_MAX`` characters."""
    obj = _record(line, "resume")
    body = obj["resume"] if obj is not None else None
    if not isinstance(body, dict) or body.get("source") not in P.ResumeSource.ALL:
        return None
    refused = body["source"] == P.ResumeSource.REFUSED
    step = _opt_int(body.get("step"))
    if refused:
        step = 0
    elif step is None or step < 0:
        return None
    source, epoch = body["source"], _opt_int(body.get("epoch"))
    reason = _one_line(body.get("reason"), P.RESUME_REASON_MAX) if refused else None
    return P.RankResumed(
        node=node,
        name=name,
        rank=rank,
        step=step,
        source=source,
        epoch=epoch,
        ts_ns=_ts_ns(obj),
        reason=reason,
    )


def _one_line(v: object, limit: int) -> str | None:
    """A rank's free text as one line (runs of whitespace, newlines included, made one space) of at
    most ``limit`` characters, the cut marked with an ellipsis; None for a non-string or an empty one.
    Other control characters are left to the views, which show them escaped."""
    if not isinstance(v, str):
        return None
    text = " ".join(v.split())
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    return text or None


def _record(line: str, key: str) -> dict | None:
    """The JSON record of a line that holds ``key`` at its top level, else None (most lines are
    metrics: a substring test spares them the JSON parse)."""
    if '"%s"' % key not in line:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and key in obj else None


def _ts_ns(obj: dict) -> int:
    """A record's own time (the rank's clock), else now."""
    ts = _opt_float(obj.get("ts"))
    return int(ts * 1e9) if ts is not None else time.time_ns()


def record_from_line(node: str, name: str, rank: int, line: str) -> P.RankPhase | P.RankResumed | None:
    """The lifecycle message an MSCON_METRICS line that is not a metric stands for: a phase record
    (``phase_from_line``) or a resume record (``resume_from_line``); None for any other line."""
    return phase_from_line(node, name, rank, line) or resume_from_line(node, name, rank, line)


class LineParser:
    """Metrics of an unmodified script from its log lines; a TimeMonitor line gives the step time
    of the loss lines that follow it."""

    def __init__(self, node: str, name: str, rank: int, line_metrics: LineMetrics) -> None:
        self.node, self.name, self.rank = node, name, rank
        self.line_metrics = line_metrics
        self.step_time_s: float | None = None
        self.read_ts: float | None = None  # when the lines being parsed were read (streaming sets it)

    def parse(self, line: str) -> P.Metric | None:
        """The line's metric, stamped ``read_ts``: the time the agent read it, the same for every
        line of one read (else now), so the console derives step times only between reads."""
        parsed = self.line_metrics.parse(line)
        if parsed is None:
            return None
        if parsed.step == NO_STEP:  # TimeMonitor: the step time of the step just reported
            self.step_time_s = parsed.step_time_s
            return None
        return P.Metric(
            node=self.node,
            name=self.name,
            rank=self.rank,
            step=parsed.step,
            epoch=parsed.epoch,
            loss=parsed.loss,
            step_time_s=parsed.step_time_s if parsed.step_time_s is not None else self.step_time_s,
            ts=self.read_ts or time.time(),
            source="parsed",
        )


def _opt_float(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _opt_int(v: object) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _opt_bool(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


# Metric's optional fields (default None), each with the record key it is read from and the reader
# for its annotated type: a field added to Metric is read from the records without a change here
# (one of a type not below fails at import, loudly).
_READERS = {
    "float | None": _opt_float,
    "int | None": _opt_int,
    "str | None": _opt_str,
    "bool | None": _opt_bool,
}
_RECORD_KEYS = {"checksum": "param_checksum"}  # the trainer's name for it
_RECORD_FIELDS = tuple(
    (f.name, _RECORD_KEYS.get(f.name, f.name), _READERS[str(f.type)])
    for f in dataclasses.fields(P.Metric)
    if f.default is None
)
