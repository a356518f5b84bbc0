"""Start-up phases of the local job under different MindSpore settings: what a knob saves.

Runs ``mscon run --no-tui -q`` on ``inventory/local.yaml`` (2 CPU ranks on this machine, no SSH)
with each configuration's extra ``job.env``, round robin so that load drifts hit every
configuration alike, and prints the median and min of each phase from the summary's
``attempts[0].phases``: import, cluster join (``joined - imported``), data set-up, graph compile
(``compiled - ready``) and launch to first step on every rank.

    .venv/bin/python bench/warm_start.py --repeat 3 \\
        --config default: --config fast-join:MS_RETRY_INTERVAL_LOWER=1,MS_RETRY_INTERVAL_UPPER=1

``--compile-cache`` adds two configurations: ``cache-cold`` (MS_COMPILER_CACHE_ENABLE=1 with an
empty cache folder) and, right after it on the same folder, ``cache-warm``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
MSCON = [sys.executable, "-m", "mscon.console.cli"]
PHASES = {  # name: (from, to) milestones of the summary's phases
    "import": ("spawned", "imported"),
    "join": ("imported", "joined"),
    "data": ("joined", "ready"),
    "compile": ("ready", "compiled"),
    "first step": ("connected", "first_step"),
}


def parse_config(text: str) -> tuple[str, dict[str, str]]:
    name, _, pairs = text.partition(":")
    env = dict(p.split("=", 1) for p in pairs.split(",") if p)
    return name, env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(tmp: Path, name: str, env: dict[str, str], steps: int) -> dict[str, float]:
    doc = yaml.safe_load((REPO / "inventory" / "local.yaml").read_text())
    doc["job"]["workdir"] = str(REPO)
    doc["scheduler"]["port"] = free_port()  # others on this machine may run the local job too
    doc["job"]["env"] = {**doc["job"].get("env", {}), **env}
    doc["job"]["args"] = ["--epochs", "1", "--steps-per-epoch", str(steps)]
    inv = tmp / f"{name}.yaml"
    inv.write_text(yaml.safe_dump(doc))
    out = tmp / f"{name}.json"
    done = subprocess.run([*MSCON, "run", "--no-tui", "-q", str(inv), "--json", str(out)], cwd=tmp,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{name}: mscon exited {done.returncode}:\n{done.stderr[-2000:]}")
    summary = json.loads(out.read_text())
    shutil.rmtree(summary["logs_dir"], ignore_errors=True)
    phases = summary["attempts"][0]["phases"]
    return {k: phases[b] - phases[a] for k, (a, b) in PHASES.items() if phases[a] is not None and phases[b]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--config", action="append", default=[], help="NAME:K=V,K=V (extra job.env)")
    p.add_argument("--compile-cache", action="store_true", help="add cache-cold and cache-warm")
    args = p.parse_args(argv)
    configs = [parse_config(c) for c in args.config] or [("default", {})]
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="mscon-warm-") as scratch:
        tmp = Path(scratch)
        for trial in range(args.repeat):
            for name, env in configs:
                results.setdefault(name, []).append(run_once(tmp, name, env, args.steps))
            if args.compile_cache:
                cache = tmp / f"cache{trial}"
                env = {"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(cache)}
                for name in ("cache-cold", "cache-warm"):
                    results.setdefault(name, []).append(run_once(tmp, name, env, args.steps))
            print(f"trial {trial + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    print(f"{'config':<14}" + "".join(f"{k:>22}" for k in PHASES))
    for name, runs in results.items():
        cells = []
        for k in PHASES:
            vals = [r[k] for r in runs if k in r]
            cells.append(f"{statistics.median(vals):>8.2f} (min {min(vals):5.2f})" if vals else f"{'-':>22}")
        print(f"{name:<14}" + "".join(f"{c:>22}" for c in cells))
    print(f"seconds, median (min) of {args.repeat} run(s); 2 local CPU ranks, {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
