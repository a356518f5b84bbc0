"""Device telemetry for the rank panes: utilisation and memory per device, about once a second.

The tools (nvidia-smi, npu-smi) can take a second or hang on a sick driver, so a thread of its own
samples them and the agent's loop only reads the latest figures. Parsing is the preflight's
(checks/smi.py), so the two never disagree about a tool's format. Stdlib only.
"""

from __future__ import annotations

import os
import threading

from .checks.smi import GPU_FORMAT, GPU_QUERY, parse_gpus, parse_npu_smi
from .checks.tools import find_tool, run_cmd

_MIB = 2**20


class DeviceSample:
    def __init__(self, util: float | None, used: int | None, total: int | None) -> None:
        self.util = util  # percent
        self.used = used  # bytes
        self.total = total


def sample(target: str, timeout_s: float = 5.0) -> dict:
    """Device index -> DeviceSample, from nvidia-smi (GPU) or npu-smi (Ascend); {} elsewhere."""
    env = dict(os.environ)  # the node's own PATH finds the tools
    if target == "GPU":
        tool = find_tool("nvidia-smi", env)
        if tool is None:
            return {}
        ran = run_cmd([tool, GPU_QUERY, GPU_FORMAT], timeout_s)
        if ran.rc != 0:
            return {}
        out = {}
        for g in parse_gpus(ran.out):
            used = g.mem_used * _MIB if g.mem_used is not None else None
            total = g.mem_total * _MIB if g.mem_total is not None else None
            util = float(g.util) if g.util is not None else None
            out[g.index] = DeviceSample(util, used, total)
        return out
    if target == "Ascend":
        tool = find_tool("npu-smi", env)
        if tool is None:
            return {}
        ran = run_cmd([tool, "info"], timeout_s)
        if ran.rc != 0:
            return {}
        chips = parse_npu_smi(ran.out).chips
        out = {}
        for i, chip in enumerate(chips):  # chips come in logical device order
            used = chip.hbm_used * _MIB if chip.hbm_used is not None else None
            total = chip.hbm_total * _MIB if chip.hbm_total is not None else None
            out[i] = DeviceSample(None, used, total)
        return out
    return {}


class DeviceSampler:
    def __init__(self, target: str, interval_s: float = 1.0) -> None:
        self.target = target
        self.interval_s = interval_s
        self.latest: dict = {}
        self._stop = threading.Event()
        if target in ("GPU", "Ascend"):
            threading.Thread(target=self._run, name="devices", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.latest = sample(self.target)
            except Exception:  # noqa: BLE001 - telemetry is best effort: a broken tool means n/a
                self.latest = {}
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
