"""Which function answers each check name, and the loop that runs them without ever raising."""

from __future__ import annotations

from typing import Sequence

from .clock import check_clock
from .disk import check_disk
from .env import check_env
from .gpu import check_gpu
from .ifname import check_ifname
from .limits import check_limits
from .npu import check_npu
from .params import Params
from .ports import check_port
from .python_env import check_mindspore, check_python
from .results import NA, WARN, oneline, result
from .shm import check_shm


def run_checks(names: Sequence[str], params: dict | None, received_ns: int) -> list:
    """Run the named checks (see the package's ``run_node_checks``); never raises."""
    out: list = []
    try:
        p = Params(params if isinstance(params, dict) else {}, received_ns)
        wanted = [names] if isinstance(names, str) else list(names or ())
    except Exception as exc:  # never raise
        return [result("checks", WARN, "bad request: %s" % oneline(exc), "report this as an mscon bug")]
    seen = set()
    for name in wanted:
        if not isinstance(name, str) or name in seen:
            continue
        seen.add(name)
        fn = CHECKS.get(name)
        if fn is None:
            out.append(
                result(
                    name, WARN, "unknown check", "update mscon on this node (the console and agent differ)"
                )
            )
            continue
        try:
            out.extend(fn(p))
        except Exception as exc:  # a bug in a check must not stop the others
            out.append(
                result(
                    name,
                    WARN,
                    "check crashed: %s: %s" % (type(exc).__name__, oneline(exc)),
                    "report this as an mscon bug",
                )
            )
    return out


def check_devices(p: Params) -> list:
    """``devices``: the accelerator family of the device target; n/a on CPU."""
    if p.target == "GPU":
        return check_gpu(p)
    if p.target == "Ascend":
        return check_npu(p)
    return [
        result("devices", NA, p.target, detail="no accelerator is needed for device_target %s" % p.target)
    ]


CHECKS = {
    "python": check_python,
    "mindspore": check_mindspore,
    "devices": check_devices,
    "shm": check_shm,
    "limits": check_limits,
    "disk": check_disk,
    "port": check_port,
    "ifname": check_ifname,
    "env": check_env,
    "clock": check_clock,
}
