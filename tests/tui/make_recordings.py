"""Make the recordings the console tests replay (tests/tui/data/*.jsonl) from real fake-rank runs.

    PYTHONPATH=.dev .venv/bin/python tests/tui/make_recordings.py [NAME ...]

Each is a real ``mscon run --no-tui --events`` of tests/tui/tui_rank.py on the local transport,
except ``short`` and ``cluster`` (named only on the command line), real MindSpore runs of the
project's trainer.
``checks.jsonl`` is ``ok.jsonl`` with preflight results put in front (written here, not measured:
the preflight of ``mscon check`` produces the same CheckReported/ChecksFinished events).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA = HERE / "data"
RANK = "tests/tui/tui_rank.py"

RUNS = {
    "ok": (4, ["--steps", "30", "--rate", "10", "--slow-rank", "3", "--slow", "2"], 0),
    "fail": (4, ["--steps", "200", "--rate", "10", "--fail-rank", "2", "--fail-step", "12"], 0),
    "restart": (2, ["--steps", "25", "--rate", "10", "--fail-rank", "1", "--fail-step", "8"], 1),
    "wide": (40, ["--steps", "12", "--rate", "4", "--slow-rank", "7", "--slow", "2"], 0),
}

CHECKS = [
    ("local", "python", "ok", "3.11.9", ""),
    ("local", "mindspore", "ok", "2.10.0", ""),
    ("local", "shm", "warn", "4.0 GiB", "raise /dev/shm to >= 8 GiB (checks.shm_min_gib)"),
    ("local", "ports", "ok", "18118 free", ""),
    ("local", "disk", "fail", "0.4 GiB free", "free space under ~/.cache/mscon (>= 2 GiB)"),
    ("*", "clock skew", "ok", "max 3 ms", ""),
]


def record(name: str, ranks: int, args: list[str], max_restarts: int) -> Path:
    doc = {
        "name": "tui-test",
        "device_target": "CPU",
        "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": ranks}],
        "scheduler": {"port": 18300},
        "job": {"workdir": str(REPO), "script": RANK, "args": args},
        "restart": {"max_restarts": max_restarts, "backoff_s": 0.5},
        "stop": {"grace_s": 2},
    }
    return record_inventory(name, doc)


def record_inventory(name: str, doc: dict, run_id: str | None = None) -> Path:
    out = DATA / f"{name}.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inv.yaml"
        inv.write_text(yaml.safe_dump(doc))
        cmd = [
            sys.executable,
            "-m",
            "mscon.console.cli",
            "run",
            "--no-tui",
            "-q",
            str(inv),
            "--run-id",
            run_id or f"tui-{name}",
            "--logs-dir",
            str(Path(tmp) / "runs"),
            "--events",
            str(out),
        ]
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
        print(name, "exit", done.returncode, done.stderr.strip().splitlines()[-1:])
    return out


def with_checks(src: Path, dst: Path) -> None:
    lines = src.read_text().splitlines()
    checks = [
        json.dumps(
            {
                "kind": "check",
                "attempt": 0,
                "node": n,
                "name": c,
                "status": s,
                "value": v,
                "remedy": r,
                "detail": "",
            }
        )
        for n, c, s, v, r in CHECKS
    ]
    fin = json.dumps({"kind": "checks_finished", "attempt": 0, "failed": ["local: disk"], "skipped": ["gpu"]})
    dst.write_text("\n".join([lines[0], *checks, fin, *lines[1:]]) + "\n")


def record_short() -> Path:
    """``short.jsonl``: the README's first job as it is (inventory/local.yaml: 2 MindSpore ranks,
    40 steps in well under a second, MindSpore's INFO lines last), for the console after a short run."""
    doc = yaml.safe_load((REPO / "inventory" / "local.yaml").read_text())
    doc["job"]["workdir"] = str(REPO)
    return record_inventory("short", doc)


def record_cluster() -> Path:
    """``cluster.jsonl``: 2 nodes x 2 MindSpore ranks (two loopback sshd nodes, tests/sshd_nodes.py),
    for the README's screenshot (bench/screenshot.py)."""
    sys.path.insert(0, str(REPO / "tests"))
    from sshd_nodes import start_sshd_cluster

    with tempfile.TemporaryDirectory() as tmp, start_sshd_cluster(Path(tmp) / "sshd", n=2) as cluster:
        doc = {
            "name": "cluster",
            "device_target": "CPU",
            "defaults": {
                "user": "root",
                "port": cluster.port,
                "identity_file": str(cluster.client_key),
                "python": sys.executable,
            },
            "nodes": [{"host": n.host, "name": n.name, "devices": 2} for n in cluster.nodes],
            "scheduler": {"port": 18310},
            "job": {
                "workdir": str(REPO),
                "script": "trainer/train.py",
                "args": ["--parallel-mode", "data_parallel", "--epochs", "3", "--steps-per-epoch", "150"],
                "env": {"GLOG_v": "3"},
            },
            "ssh": {"known_hosts": str(cluster.known_hosts)},
            "stop": {"grace_s": 3},
        }
        # a fresh id: the nodes' run folders (under root's home) outlive the temporary folder
        return record_inventory("cluster", doc, f"tui-cluster-{time.strftime('%Y%m%d-%H%M%S')}")


REAL = {"short": record_short, "cluster": record_cluster}  # real MindSpore runs: need mindspore

if __name__ == "__main__":
    DATA.mkdir(parents=True, exist_ok=True)
    wanted = sys.argv[1:] or list(RUNS)
    for name in wanted:
        if name in RUNS:
            record(name, *RUNS[name])
        elif name in REAL:
            REAL[name]()
    if "ok" in wanted:
        with_checks(DATA / "ok.jsonl", DATA / "checks.jsonl")
