"""The replica checksum (the metrics file itself is mscon_resume's MetricsWriter)."""

from __future__ import annotations

import hashlib
from typing import Any


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
