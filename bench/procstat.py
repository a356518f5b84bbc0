"""Helpers the benchmarks share: the sshd test-node module and a snapshot of /proc."""

from __future__ import annotations

import collections
import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sshd_nodes() -> types.ModuleType:
    """tests/sshd_nodes.py (a test helper, not part of the package)."""
    sys.path.insert(0, str(REPO / "tests"))
    import sshd_nodes as mod

    return mod


def proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used so far) for every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        out[int(entry)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / CLK_TCK)
    return out


def foreign_cpu(ours: set[int]) -> dict[int, float]:
    """CPU seconds per process outside this process's tree. ``ours`` grows with every call: once
    ours, always ours (an orphan is re-parented to init but still counts as ours)."""
    table = proc_table()
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, (ppid, _) in table.items():
        children[ppid].append(pid)
    stack = [os.getpid()]
    while stack:
        pid = stack.pop()
        ours.add(pid)
        stack.extend(children.get(pid, ()))
    return {pid: cpu for pid, (_, cpu) in table.items() if pid not in ours}


def ms_ports() -> list[str]:
    """MS_SCHED_PORT of every live MindSpore-cluster process (ranks and schedulers carry MS_ROLE)."""
    ports = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"MS_ROLE=") for v in env):
            port = next((v[14:] for v in env if v.startswith(b"MS_SCHED_PORT=")), b"?")
            ports.append(port.decode(errors="replace"))
    return ports
