"""The ``devices`` check on device_target Ascend: ``npu.count``, ``npu.visible``, ``npu.driver``,
``npu.health``, ``npu.busy`` (npu-smi info), and the NPU network ports ``npu.link``, ``npu.net``
(``hccn_tool -i N -link -g``: ``link status: UP`` or ``DOWN``; ``hccn_tool -i N -net_health -g``:
``net health status: Success``, else ``Fault``, ``Init``, ``Socket fail``, ...)."""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple

from .device_count import DeviceTool, counted, tool_failed, tool_missing
from .hccn import NET_HEALTH_GOOD, parse_hccn_link, parse_hccn_net_health
from .params import Params
from .results import FAIL, NA, OK, WARN, oneline, result
from .smi import parse_npu_smi
from .tools import find_tool, run_cmd
from .visible import visible_entries, visible_result

NPU_SMI = DeviceTool(
    check="npu.count",
    tool="npu-smi",
    call="npu-smi info",
    driver="Ascend",
    unit="NPUs",
    install="install the Ascend driver on this node (npu-smi comes with it)",
    why_needed="device_target Ascend needs the Ascend driver; npu-smi is not on PATH",
    fix="fix its NPUs",
)


def check_npu(p: Params) -> list:
    env = p.rank_env()
    tool = find_tool(NPU_SMI.tool, env)
    if tool is None:
        return [tool_missing(NPU_SMI)]
    ran = run_cmd([tool, "info"], p.timeout_s, env=env)
    if ran.rc != 0:
        return [tool_failed(NPU_SMI, ran, p.timeout_s)]
    table = parse_npu_smi(ran.out)
    version, chips, procs = table.version, list(table.chips), table.procs
    out = [counted(NPU_SMI, p, [c.name for c in chips], oneline(ran.out, 1000))]
    raw, entries = visible_entries(p, "ASCEND_RT_VISIBLE_DEVICES")
    ids = [str(i) for i in range(len(chips))]  # logical ids, in npu-smi's order
    vis, use = visible_result("npu.visible", "ASCEND_RT_VISIBLE_DEVICES", raw, entries, ids, p)
    out.append(vis)
    out.append(result("npu.driver", OK if version else NA, version))
    used = [c for i, c in enumerate(chips) if i in use] if use else chips
    bad = [c for c in used if c.health.upper() != "OK"]
    if bad:
        serious = any(c.health.lower() not in ("warning",) for c in bad)
        out.append(
            result(
                "npu.health",
                FAIL if serious else WARN,
                ", ".join("%s: %s" % (c.label, c.health) for c in bad),
                "see npu-smi info -t health -i N; drain the node or replace the NPU",
                "Health is OK, Warning (minor), Alarm (major) or Critical",
            )
        )
    else:
        out.append(result("npu.health", OK if used else NA, "OK" if used else ""))
    keys = {(c.npu, c.chip) for c in used}
    busy = [
        "NPU %d chip %d: pid %d %s" % (q.npu, q.chip, q.pid, q.name) for q in procs if (q.npu, q.chip) in keys
    ]
    if busy:
        out.append(
            result(
                "npu.busy",
                WARN,
                "%d in use" % len({b.split(":")[0] for b in busy}),
                "stop those processes, or point ASCEND_RT_VISIBLE_DEVICES at free NPUs",
                "; ".join(busy),
            )
        )
    else:
        out.append(result("npu.busy", OK, "idle"))
    out.extend(_hccn(p, env, [c.hccn_id for c in used]))
    return out


class _PortCheck(NamedTuple):
    """One hccn_tool query asked of every NPU port, reported as one check."""

    name: str
    query: str  # hccn_tool -i N -<query> -g
    parse: Callable[[str], str | None]  # the port's status in the answer (checks/hccn.py)
    good: str  # that status on a healthy port, lower case
    bad_status: str  # the check's status when a port's is not good
    remedy: str
    why: str
    ok_value: str  # str.format()ted with the number of ports


_PORT_CHECKS = (
    _PortCheck(
        "npu.link",
        "link",
        parse_hccn_link,
        "up",
        FAIL,
        "check the NPU ports' cables and switch (hccn_tool -i N -link -g)",
        "HCCL across nodes needs every NPU port up",
        "{} up",
    ),
    _PortCheck(
        "npu.net",
        "net_health",
        parse_hccn_net_health,
        NET_HEALTH_GOOD.lower(),
        WARN,
        "check the NPU network (hccn_tool -i N -net_health -g; -netdetect -g; -ip -g)",
        "net health other than Success: the detect IP does not answer over the NPU network",
        "Success",
    ),
)


def _hccn(p: Params, env: dict, ids: list) -> list:
    """NPU network ports (RoCE), used by HCCL across nodes."""
    if p.nodes == 1:
        why = "a single-node job: HCCL does not use the NPU network ports"
        return [result("npu.link", NA, detail=why), result("npu.net", NA, detail=why)]
    tool = find_tool("hccn_tool", env)
    if tool is None:
        why = "hccn_tool not found (it comes with the Ascend driver, under /usr/local/Ascend/driver/tools)"
        return [result("npu.link", NA, "hccn_tool not found", detail=why), result("npu.net", NA, detail=why)]
    answers: dict = {}

    def ask(i: int, what: str) -> None:
        answers[(i, what)] = run_cmd([tool, "-i", str(i), "-" + what, "-g"], p.timeout_s, env=env)

    threads = [
        threading.Thread(target=ask, args=(i, c.query), daemon=True) for i in ids for c in _PORT_CHECKS
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [_port_result(p, c, [(i, answers[(i, c.query)]) for i in ids]) for c in _PORT_CHECKS]


def _port_result(p: Params, check: _PortCheck, answers: list) -> dict:
    """The ports whose status is not good, else those that could not be asked, else OK."""
    bad, unasked = [], []
    for i, ran in answers:
        status = check.parse(ran.out) if ran.rc == 0 else None
        if status is None:
            unasked.append(
                "device %d: %s" % (i, ran.why(p.timeout_s) if ran.rc != 0 else oneline(ran.out, 80))
            )
        elif status.lower() != check.good:
            bad.append("device %d: %s" % (i, status))
    if bad:
        return result(check.name, check.bad_status, "; ".join(bad), check.remedy, check.why)
    if unasked:
        return result(check.name, WARN, "; ".join(unasked), "check hccn_tool on this node")
    value = check.ok_value.format(len(answers)) if answers else ""
    return result(check.name, OK, value, detail="hccn_tool -i N -%s -g" % check.query)
