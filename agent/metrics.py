"""Metric messages from what a rank writes: its MSCON_METRICS records, or its printed loss lines.

One place builds them, for the live tail (main.py) and for the replay an attaching console gets
(relay.py). Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import time

from . import protocol as P
from .tail import NO_STEP, LineMetrics


def from_record(node: str, name: str, rank: int, obj: dict) -> P.Metric:
    """A Metric from one MSCON_METRICS JSON record (``tail.parse_metrics_line``)."""
    return P.Metric(
        node=node,
        name=name,
        rank=rank,
        step=obj["step"],
        epoch=_opt_int(obj.get("epoch")),
        loss=_opt_float(obj.get("loss")),
        step_time_s=_opt_float(obj.get("step_time_s")),
        samples_per_s=_opt_float(obj.get("samples_per_s")),
        ts=_opt_float(obj.get("ts")) or time.time(),
        source="metrics",
        loss_scale=_opt_float(obj.get("loss_scale")),
        overflow=obj["overflow"] if isinstance(obj.get("overflow"), bool) else None,
        device_memory_bytes=_opt_int(obj.get("device_memory_bytes")),
        checksum=_opt_str(obj.get("param_checksum")),
        profile_dir=_opt_str(obj.get("profile_dir")),
    )


class LineParser:
    """Metrics of an unmodified script from its log lines; a TimeMonitor line gives the step time
    of the loss lines that follow it."""

    def __init__(self, node: str, name: str, rank: int, line_metrics: LineMetrics) -> None:
        self.node, self.name, self.rank = node, name, rank
        self.line_metrics = line_metrics
        self.step_time_s: float | None = None

    def parse(self, line: str) -> P.Metric | None:
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
            ts=time.time(),
            source="parsed",
        )


def _opt_float(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _opt_int(v: object) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) else None
