"""Helpers the benchmarks share: the environment they run mscon from, where its nodes keep runs,
the sshd test-node module and a snapshot of /proc."""

from __future__ import annotations

import collections
import json
import os
import pwd
import statistics
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

try:
    from mscon.agent import layout
except ImportError:  # a Python without mscon (its tools come from .venv): the checkout's copy, stdlib only
    sys.path.insert(0, str(REPO))
    from agent import layout


@dataclass(frozen=True)
class ToolEnv:
    """The environment a benchmark takes msrun, mscon and the ranks' Python from."""

    bin: Path
    python: Path

    def missing(self, *tools: str) -> list[str]:
        return [t for t in tools if not (self.bin / t).exists()]

    def problem(self, *tools: str) -> str | None:
        """What to tell the user when one of ``tools`` is not there; None when all are."""
        if not self.missing(*tools):
            return None
        where = f"the running Python's environment ({Path(sys.executable).parent}) or {REPO / '.venv'}"
        return f"need {' and '.join(tools)} in {where}"


def tool_env(*tools: str) -> ToolEnv:
    """The running Python's environment (``sys.executable``'s folder, not resolved: a venv's python
    links out of it) when it holds every one of ``tools``; else the checkout's ``.venv`` when that
    does; else the running one again (``missing`` says what it lacks)."""
    own = Path(sys.executable).parent
    venv = REPO / ".venv" / "bin"
    if not ToolEnv(own, Path(sys.executable)).missing(*tools) or ToolEnv(venv, venv).missing(*tools):
        return ToolEnv(own, Path(sys.executable))
    return ToolEnv(venv, venv / "python")


def node_runs(user: str | None = None) -> Path:
    """Where mscon's agents on this machine keep run folders (``agent/layout.py``): under ``user``'s
    passwd home for sshd nodes (sshd sets HOME from it), under this process's HOME for local nodes
    (their agents inherit it)."""
    home = pwd.getpwnam(user).pw_dir if user else str(Path.home())
    return Path(layout.runs_root(layout.cache_folder(home)))


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


def foreign_cpu(ours: set[int], roots: Iterable[int] = ()) -> dict[int, float]:
    """CPU seconds per process outside this process's tree (and the trees of ``roots``: ours too,
    though no child of ours, such as a keeper an agent left in its own session). ``ours`` grows
    with every call: once ours, always ours (an orphan is re-parented to init but still counts as
    ours)."""
    table = proc_table()
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, (ppid, _) in table.items():
        children[ppid].append(pid)
    stack = [os.getpid(), *roots]
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


# ---------------------------------------------------------------- mscon's start-up breakdown


def start_up(summary: Path) -> list[tuple[int, str, list[tuple[str, float]]]]:
    """Each attempt's start-up breakdown from an mscon summary (``--json``: ``attempts[].phases``,
    console/engine/phases.py): (attempt, the line mscon prints, [(milestone, seconds it took)])."""
    try:
        doc = json.loads(summary.read_text(encoding="utf-8"))
        from mscon.console.engine.phases import describe_phases, phases_from_json, steps
    except (OSError, ValueError, ImportError):
        return []
    out = []
    for a in doc.get("attempts") or []:
        if a.get("phases"):
            p = phases_from_json(a["phases"])
            out.append((int(a["attempt"]), describe_phases(p), steps(p)))
    return out


def phase_medians(runs: list[list[tuple[str, float]]]) -> str:
    """Median seconds of each milestone over several runs' breakdowns (``start_up``'s third item),
    in the order of the first run that has it: "connected 0.31, agents up 1.20, ..."."""
    order: list[str] = []
    took: dict[str, list[float]] = collections.defaultdict(list)
    for run in runs:
        for label, seconds in run:
            if label not in took:
                order.append(label)
            took[label].append(seconds)
    return ", ".join(f"{label} {statistics.median(took[label]):.2f}" for label in order)
