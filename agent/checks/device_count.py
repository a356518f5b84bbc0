"""The ``<kind>.count`` result of a device check (gpu.py, npu.py): the vendor tool missing or not
answering, fewer devices than the node's ranks need, or none at all, all fail the same way.

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .params import Params
from .results import FAIL, OK, oneline, result


class DeviceTool(NamedTuple):
    """What a device check's words name: its tool, the driver it comes with, the devices."""

    check: str  # "gpu.count"
    tool: str  # the executable: "nvidia-smi"
    call: str  # the call that lists the devices, as the node's user would type it: "npu-smi info"
    driver: str  # "NVIDIA"
    unit: str  # the devices, plural: "GPUs"
    install: str  # the remedy when the tool is not found
    why_needed: str  # the detail then
    fix: str  # "set devices: N for this node, or <fix>"


def tool_missing(t: DeviceTool) -> dict:
    return result(t.check, FAIL, "%s not found" % t.tool, t.install, t.why_needed)


def tool_failed(t: DeviceTool, ran, timeout_s: float) -> dict:  # noqa: ANN001 - tools.Ran
    return result(
        t.check,
        FAIL,
        "%s: %s" % (t.call, ran.why(timeout_s)),
        "check the %s driver on this node (%s must answer)" % (t.driver, t.call),
        oneline(ran.out + " " + ran.err, 1000),
    )


def counted(t: DeviceTool, p: Params, names: Sequence[str], none_detail: str) -> dict:
    """``names``: one per device found (its model). FAIL when the node has fewer than its ranks
    need (``devices``), or none; OK otherwise."""
    n = len(names)
    value = "%d x %s" % (n, "/".join(sorted(set(names)))) if n else "0 %s" % t.unit
    if p.devices is not None and n < p.devices:
        return result(
            t.check,
            FAIL,
            value,
            "set devices: %d for this node, or %s" % (n, t.fix),
            "%d ranks on this node need %d %s; %s lists %d" % (p.devices, p.devices, t.unit, t.call, n),
        )
    if not n:
        return result(t.check, FAIL, value, "check the %s driver on this node" % t.driver, none_detail)
    return result(t.check, OK, value)
