"""The ``devices`` check on device_target GPU (nvidia-smi): ``gpu.count``, ``gpu.visible``,
``gpu.driver``, ``gpu.busy``, ``gpu.ecc``, and ``gpu.xid`` from the kernel log."""

from __future__ import annotations

from .device_count import DeviceTool, counted, tool_failed, tool_missing
from .params import Params
from .results import FAIL, NA, OK, WARN, result
from .smi import GPU_FORMAT, GPU_QUERY, num, parse_gpu_apps, parse_gpus
from .tools import find_tool, proc_name, run_cmd
from .visible import visible_entries, visible_result
from .xid import parse_xids

NVIDIA_SMI = DeviceTool(
    check="gpu.count",
    tool="nvidia-smi",
    call="nvidia-smi",
    driver="NVIDIA",
    unit="GPUs",
    install="install the NVIDIA driver on this node (or run on a node with GPUs)",
    why_needed="device_target GPU needs the NVIDIA driver; nvidia-smi is not on PATH",
    fix="free/fix its GPUs",
)


def check_gpu(p: Params) -> list:
    env = p.rank_env()
    tool = find_tool(NVIDIA_SMI.tool, env)
    if tool is None:
        return [tool_missing(NVIDIA_SMI)]
    ran = run_cmd([tool, GPU_QUERY, GPU_FORMAT], p.timeout_s, env=env)
    if ran.rc != 0:
        return [tool_failed(NVIDIA_SMI, ran, p.timeout_s)]
    gpus = parse_gpus(ran.out)
    out = [counted(NVIDIA_SMI, p, [g.name for g in gpus], ran.out.strip())]
    raw, entries = visible_entries(p, "CUDA_VISIBLE_DEVICES")
    vis, use = visible_result("gpu.visible", "CUDA_VISIBLE_DEVICES", raw, entries, [g.uuid for g in gpus], p)
    out.append(vis)
    drivers = sorted({g.driver for g in gpus})
    if len(drivers) > 1:
        out.append(result("gpu.driver", WARN, ",".join(drivers), "one driver version per node", ""))
    else:
        out.append(result("gpu.driver", OK if drivers else NA, drivers[0] if drivers else ""))
    used = [g for g in gpus if g.index in use] if use else gpus
    mig = [g for g in used if g.mig]
    if mig:  # only then: a node without MIG keeps its list of checks
        out.append(
            result(
                "gpu.mig",
                WARN,
                ", ".join("GPU %s" % g.index for g in mig) + " in MIG mode",
                "disable MIG (nvidia-smi -i N -mig 0, then reset the GPU), or give each rank a MIG device",
                "ranks see a MIG GPU's MIG devices (nvidia-smi -L), not the GPU",
            )
        )
    out.append(_gpu_busy(p, env, tool, used))
    ecc = [g for g in used if g.ecc]
    if ecc:
        out.append(
            result(
                "gpu.ecc",
                WARN,
                ", ".join("GPU %s: %d" % (g.index, g.ecc) for g in ecc),
                "drain or reset these GPUs (nvidia-smi -q -d ECC; nvidia-smi -r -i N)",
                "uncorrected ECC errors since the driver loaded",
            )
        )
    elif used and all(g.ecc is None for g in used):
        out.append(result("gpu.ecc", NA, "ECC not reported", detail="these GPUs report no ECC counters"))
    else:
        out.append(result("gpu.ecc", OK, "0 uncorrected"))
    out.append(_gpu_xid(p, env, tool, used))
    return out


# The kernel driver's error reports (checks/xid.py reads them). Codes after NVIDIA's Xid catalog;
# these mean the GPU needs a reset or a repair, the others (13, 31, 43, ...) are mostly a program's
# faults and are only shown.
XID_NEEDS_RESET = {
    48: "double-bit ECC error",
    64: "row remapping failed",
    74: "NVLink error",
    79: "fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def _bus_key(bus: str) -> str:
    """ "00000000:3B:00.0" (nvidia-smi) and "0000:3b:00" (the kernel log) alike: "0000:3b:00"."""
    parts = bus.strip().lower().split(".")[0].split(":")
    return ":".join([parts[0][-4:]] + parts[1:]) if len(parts) == 3 else bus.strip().lower()


def kernel_log(p: Params, env: dict) -> tuple:
    """(the kernel's messages, the tool that read them), or (None, why they could not be read):
    dmesg first, then the journal (readable for the adm/systemd-journal groups where dmesg is
    restricted)."""
    why = []
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        tool = find_tool(argv[0], env)
        if tool is None:
            why.append("%s not found" % argv[0])
            continue
        ran = run_cmd([tool] + argv[1:], p.timeout_s, env=env)
        if ran.rc == 0:
            return ran.out, argv[0]
        why.append("%s: %s" % (argv[0], ran.why(p.timeout_s)))
    return None, "; ".join(why)


def _gpu_xid(p: Params, env: dict, tool: str, used: list) -> dict:
    text, how = kernel_log(p, env)
    if text is None:
        return result("gpu.xid", NA, "kernel log not readable", detail=how)
    events = [(x.bus, x.code) for x in parse_xids(text)]
    if not events:
        return result("gpu.xid", OK, "none in the kernel log", detail="read with %s" % how)
    ran = run_cmd([tool, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], p.timeout_s, env=env)
    index = {}
    for line in ran.out.splitlines() if ran.rc == 0 else []:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and num(fields[0]) is not None:
            index[_bus_key(fields[1])] = num(fields[0])
    ours = {g.index for g in used}
    counts: dict = {}  # (label, code) -> how many
    for bus, code in events:
        gpu = index.get(_bus_key(bus))
        if gpu is not None and gpu not in ours:
            continue  # a GPU the ranks do not use
        label = "GPU %d" % gpu if gpu is not None else "PCI %s" % bus
        key = (label, code)
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return result("gpu.xid", OK, "none on the GPUs the ranks use", detail="read with %s" % how)
    shown = []
    for (label, code), n in sorted(counts.items()):
        what = XID_NEEDS_RESET.get(code)
        shown.append(
            "%s: Xid %d%s%s" % (label, code, " (%s)" % what if what else "", " x%d" % n if n > 1 else "")
        )
    detail = "since boot, read with %s; NVIDIA's Xid catalog explains each code" % how
    if any(code in XID_NEEDS_RESET for _, code in counts):
        return result(
            "gpu.xid",
            FAIL,
            "; ".join(shown),
            "reset or drain that GPU (nvidia-smi -r -i N, or reboot); the kernel log keeps Xids until a "
            "reboot: once it is fixed, --skip-check gpu.xid",
            detail,
        )
    return result(
        "gpu.xid", WARN, "; ".join(shown), "see the kernel log (dmesg) for what the GPU reported", detail
    )


def _gpu_busy(p: Params, env: dict, tool: str, used: list) -> dict:
    ran = run_cmd(
        [tool, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader"], p.timeout_s, env=env
    )
    by_uuid = {g.uuid: g for g in used}
    procs = []
    if ran.rc == 0:
        for app in parse_gpu_apps(ran.out):
            pid, mib = app.pid, app.used_mib
            g = by_uuid.get(app.uuid)
            if g is None:
                continue
            procs.append(
                "GPU %s: pid %d %s(%s)" % (g.index, pid, proc_name(pid), "%s MiB" % mib if mib else "?")
            )
    # Processes of other containers are not listed; their memory shows.
    hidden = [
        g
        for g in used
        if g.mem_used is not None
        and g.mem_total
        and g.mem_used > max(1024, g.mem_total // 10)
        and not any(s.startswith("GPU %s:" % g.index) for s in procs)
    ]
    for g in hidden:
        procs.append(
            "GPU %s: %d of %d MiB in use by processes not visible here" % (g.index, g.mem_used, g.mem_total)
        )
    if procs:
        return result(
            "gpu.busy",
            WARN,
            "%d in use" % len({s.split(":")[0] for s in procs}),
            "stop those processes, or point CUDA_VISIBLE_DEVICES at free GPUs",
            "; ".join(procs),
        )
    if ran.rc != 0:
        return result("gpu.busy", NA, "compute apps: %s" % ran.why(p.timeout_s))
    return result("gpu.busy", OK, "idle")
