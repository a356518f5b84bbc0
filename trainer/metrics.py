"""Structured metrics for the console (JSON lines to $MSCON_METRICS) and the replica checksum."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


class MetricsWriter:
    """One writer per rank; line-buffered so a killed rank leaves whole lines behind."""

    def __init__(self, path: str | None) -> None:
        self.out = open(path, "a", buffering=1, encoding="utf-8") if path else None  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        if self.out is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self.out.write(json.dumps({**clean, "ts": _now()}) + "\n")

    def phase(self, name: str) -> None:
        """A start-up milestone (imported, joined, ready, compiled), timed by this rank's clock: the
        console's breakdown of where a launch or restart spent its time (agent/protocol.py Milestone)."""
        if self.out is not None:
            self.out.write(json.dumps({"phase": name, "ts": _now()}) + "\n")

    def close(self) -> None:
        if self.out is not None:
            self.out.close()


def _now() -> float:
    import time

    return time.time()


def param_checksum(net: Any) -> str:
    """A digest of every trainable parameter: data-parallel replicas must report the same one.

    A rank that differs was initialised or fed differently (seed 003's mask bug) or missed an
    update; the console flags it.
    """
    h = hashlib.sha256()
    for p in net.trainable_params():
        h.update(p.name.encode())
        h.update(p.asnumpy().tobytes())
    return h.hexdigest()[:16]
