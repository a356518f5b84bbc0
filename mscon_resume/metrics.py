"""Structured metrics for the console: JSON lines to ``$MSCON_METRICS`` (one per step, also the
rank's step-boundary heartbeat), start-up milestones and the resume record."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from typing import Any

from . import env


def _private(path: str, flags: int) -> int:
    fd = os.open(path, flags, 0o600)
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


class MetricsWriter:
    """One writer per rank; line-buffered so a killed rank leaves whole lines behind. Without
    ``$MSCON_METRICS`` (plain ``python``/``msrun``) it writes nothing."""

    def __init__(self, path: str | None = None) -> None:
        path = path if path is not None else os.environ.get(env.METRICS)
        if path and "{rank}" in path:  # one setting for every rank of a launch (msrun)
            path = path.replace("{rank}", str(_rank()))
        # 0600 whatever the umask: it lies in the run's folder on the node, the user's only.
        self.out = open(path, "a", buffering=1, encoding="utf-8", opener=_private) if path else None  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        if self.out is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self.out.write(json.dumps({**clean, "ts": time.time()}) + "\n")

    def phase(self, name: str, graph: str | None = None) -> None:
        """A start-up milestone (imported, joined, ready, compiled), timed by this rank's clock;
        ``graph`` (compiled only): whether the first step loaded its graph from the compile cache
        or compiled it (compile_cache.py; None: not known)."""
        if self.out is not None:
            record: dict[str, Any] = {"phase": name, "ts": time.time()}
            if graph is not None:
                record["graph"] = graph
            self.out.write(json.dumps(record) + "\n")

    def resumed(self, step: int, epoch: int | None, source: str) -> None:
        """Where this attempt starts: after ``step`` (0: from the start), from ``source``
        ("snapshot", "checkpoint" or "none"). The console's summary says it per attempt."""
        if self.out is not None:
            what: dict[str, Any] = {"step": step, "source": source}
            if epoch is not None:
                what["epoch"] = epoch
            self.out.write(json.dumps({"resume": what, "ts": time.time()}) + "\n")

    def refused(self, reason: str) -> None:
        """This attempt refused to resume, and why (one line)."""
        if self.out is not None:
            what = {"step": 0, "source": "refused", "reason": reason}
            self.out.write(json.dumps({"resume": what, "ts": time.time()}) + "\n")

    def final(self, stage: str, step: int, digests: dict[str, str]) -> None:
        """A stage ran to its end: a digest of every kept object, so two runs of the script can
        be compared state by state (``python -m mscon_resume.check``)."""
        if self.out is not None:
            whole = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:16]
            what = {"stage": stage, "step": step, "digest": whole, "parts": digests}
            self.out.write(json.dumps({"final": what, "ts": time.time()}) + "\n")

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None


def _rank() -> int:
    """This rank's number before any cluster is joined: msrun's and mscon's ``RANK_ID``."""
    for name in ("RANK_ID", "RANK"):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 0


_SHARED: MetricsWriter | None = None


def shared() -> MetricsWriter:
    """The process's one writer, which every loop and callback of a script writes through."""
    global _SHARED
    if _SHARED is None or _SHARED.out is None:
        _SHARED = MetricsWriter()
    return _SHARED


def is_shared(writer: MetricsWriter) -> bool:
    return writer is _SHARED
