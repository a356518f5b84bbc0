"""``mscon check`` wall time for 1, 4 and 16 nodes (real sshd servers on 127.0.0.2 .. 127.0.0.17).

Every figure is the whole command, ``mscon check ... INV`` from process start to exit: Python start,
SSH connect + auth, the agent (deployed once, then found by its content hash), the checks, the
table. Each node runs 1 rank. Modes:

* ``quick``: ``mscon check --quick``, the checks ``mscon run`` runs before launching (no MindSpore
  import, no device tools, no collective).
* ``full-ms``: every check but the MindSpore import (``--no-collective --skip-check mindspore``).
* ``full``: every check, each node importing MindSpore once to read its version
  (``--no-collective``); by default on 1 and 4 nodes only: 16 imports at once on 2 shared cores are
  beyond this machine's budget of 4 MindSpore processes (and measure its CPU, not mscon);
  ``--heavy-max-nodes 16`` runs them anyway.
* ``collective``: ``full`` plus the real AllReduce over every rank (MCCL on CPU); the same limit
  (4 ranks + the scheduler), the same ``--heavy-max-nodes``.

    .venv/bin/python bench/preflight.py [--repeat 3] [--nodes 1 4 16] [--modes quick full-ms full collective]
                                        [--light-login] [--heavy-max-nodes N]

Every login to a node runs the node user's shell start-up files; root's .bashrc on this machine runs
``pyenv init`` (about 0.15 s of CPU per login). ``--light-login`` gives the test nodes' sessions an
empty HOME (``SetEnv HOME=...`` in their sshd_config), as on a node whose login files are light.

Needs root (sshd), and mscon and MindSpore in the running Python. Prints median (min) seconds per
mode and node count, the 16-node / 1-node ratio, the checks' own share (agents up -> last result),
the machine's CPU time and the mscon process's own CPU time per run, and the load average before
and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from procstat import sshd_nodes, tool_env  # bench/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parent.parent
PYTHON = tool_env().python  # the running Python: it runs mscon, and the nodes run its agents
MODES = {
    "quick": ["--quick"],
    "full-ms": ["--no-collective", "--skip-check", "mindspore"],
    "full": ["--no-collective"],
    "collective": [],
}
HEAVY = {"full", "collective"}  # MindSpore on every node: at most 4 nodes here
HEAVY_MAX_NODES = 4
CORES = os.cpu_count() or 1


def inventory(path: Path, cluster: Any, port: int) -> Path:
    doc = {
        "name": f"bench-{len(cluster.nodes)}",
        "device_target": "CPU",
        "defaults": {
            "user": "root",
            "port": cluster.port,
            "identity_file": str(cluster.client_key),
            "python": str(PYTHON),
        },
        "nodes": [{"host": n.host, "name": n.name, "devices": 1} for n in cluster.nodes],
        "scheduler": {"port": port},
        "job": {"workdir": str(REPO), "script": "bench/fake_rank.py", "args": ["--steps", "1"]},
        "ssh": {"known_hosts": str(cluster.known_hosts), "connect_timeout_s": 10},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def machine_cpu_s() -> float:
    """CPU seconds used so far by everything on the machine (busy time of all cores, /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


@dataclass(frozen=True)
class Trial:
    wall_s: float  # the whole command
    checks_s: float  # preflight alone: from the agents being up to the last result
    cpu_s: float  # the machine's CPU time meanwhile (all processes, the sshd nodes' included)
    console_cpu_s: float  # the mscon process's own (and its local children's)
    code: int
    tail: str


def one(inv: Path, mode: str, workdir: Path) -> Trial:
    out = workdir / "check.json"
    own0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, t0 = machine_cpu_s(), time.monotonic()
    p = subprocess.run(
        [str(PYTHON), "-m", "mscon.console.cli", "check", str(inv), "--json", str(out), *MODES[mode]],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall, cpu = time.monotonic() - t0, machine_cpu_s() - cpu0
    own1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The sshd servers are this process's children too, but they outlive the trial: only the mscon
    # process (and what it waited for) is counted here.
    console = own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime
    checks = json.loads(out.read_text()).get("preflight_s", 0.0) if out.exists() else 0.0
    return Trial(wall, checks, cpu, console, p.returncode, p.stderr[-2000:] + p.stdout[-2000:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--light-login", action="store_true", help="nodes' logins skip root's .bashrc")
    ap.add_argument(
        "--heavy-max-nodes",
        type=int,
        default=HEAVY_MAX_NODES,
        help="run full and collective up to this many nodes (default 4: this machine's MindSpore budget)",
    )
    a = ap.parse_args()
    sshd = sshd_nodes()
    figures: dict[tuple[str, int], list[Trial]] = {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mscon-bench-preflight-") as tmp:
        for n in a.nodes:
            cluster = sshd.start_sshd_cluster(Path(tmp) / f"sshd{n}", n=n)
            try:
                if a.light_login:
                    home = Path(tmp) / "home"
                    home.mkdir(exist_ok=True)
                    for node in list(cluster.nodes):
                        node.config.write_text(node.config.read_text() + f"SetEnv HOME={home}\n")
                        cluster.restart_node(node)
                inv = inventory(Path(tmp) / f"inv{n}.yaml", cluster, free_port())
                one(inv, "quick", Path(tmp))  # deploys the agent once: every trial below finds it
                for mode in a.modes:
                    if mode in HEAVY and n > a.heavy_max_nodes:
                        continue
                    for _ in range(a.repeat):
                        trial = one(inv, mode, Path(tmp))
                        if trial.code != 0:
                            print(f"{mode} x {n}: exit {trial.code}\n{trial.tail}", file=sys.stderr)
                            return 1
                        figures.setdefault((mode, n), []).append(trial)
            finally:
                cluster.stop()
    load_after = os.getloadavg()[0]
    login = "light logins (empty HOME)" if a.light_login else "logins run root's .bashrc (pyenv init)"
    print(f"mscon check, seconds, median (min) of {a.repeat}; each node 1 rank, sshd on loopback; {login}")
    for title, of in (
        ("whole command", lambda t: t.wall_s),
        ("checks alone (agents up -> last result)", lambda t: t.checks_s),
        (f"machine CPU seconds meanwhile ({CORES} cores)", lambda t: t.cpu_s),
        ("the mscon process's own CPU seconds", lambda t: t.console_cpu_s),
        # What each node costs the machine (sshd, the login shell, the agent, the checks): on a real
        # cluster every node pays it on its own cores; here the "nodes" share this machine's.
        ("node-side CPU seconds per node ((machine - mscon) / nodes)", None),
        (f"CPU-bound floor: machine CPU / {CORES} cores", lambda t: t.cpu_s / CORES),
    ):
        print(f"\n{title}")
        print(f"{'mode':<12}" + "".join(f"{f'{n} node(s)':>18}" for n in a.nodes) + f"{'most/1':>10}")
        for mode in a.modes:
            cells, meds = [], []
            for n in a.nodes:
                trials = figures.get((mode, n), [])
                got = [(of(t) if of else (t.cpu_s - t.console_cpu_s) / n) for t in trials]
                if got:
                    meds.append(statistics.median(got))
                    cells.append(f"{statistics.median(got):8.2f} ({min(got):.2f})")
                else:
                    cells.append("not run")
            ratio = f"{meds[-1] / meds[0]:.2f}x" if len(meds) > 1 and meds[0] else "-"
            print(f"{mode:<12}" + "".join(f"{c:>18}" for c in cells) + f"{ratio:>10}")
    print("most/1: the most nodes run in that mode over 1 node (medians)")
    print(f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after")
    skipped = [m for m in a.modes if m in HEAVY and any(n > a.heavy_max_nodes for n in a.nodes)]
    if skipped:
        print(
            f"not run above {a.heavy_max_nodes} nodes: {', '.join(skipped)} (one MindSpore import per node, "
            "or a rank each: too many MindSpore processes for 2 shared cores)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
