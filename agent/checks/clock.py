"""``clock``: this node's ``time.time_ns()`` when the request arrived, for the console's skew check."""

from __future__ import annotations

from .params import Params
from .results import OK, result


def check_clock(p: Params) -> list:
    now = p.received_ns
    if p.console_time_ns is None:
        return [result("clock", OK, str(now), detail="this node's time.time_ns() when the request arrived")]
    offset_ms = (now - p.console_time_ns) / 1e6
    return [
        result(
            "clock",
            OK,
            str(now),
            detail="%+.1f ms from the console's clock (includes the message's travel time)" % offset_ms,
        )
    ]
