"""Make the recordings the console tests replay (tests/tui/data/*.jsonl) from real fake-rank runs.

    PYTHONPATH=.dev .venv/bin/python tests/tui/make_recordings.py

Each is a real ``mscon run --no-tui --events`` of tests/tui/tui_rank.py on the local transport.
``checks.jsonl`` is ``ok.jsonl`` with preflight results put in front (written here, not measured:
the preflight of ``mscon check`` produces the same CheckReported/ChecksFinished events).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
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
    out = DATA / f"{name}.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inv.yaml"
        inv.write_text(
            yaml.safe_dump(
                {
                    "name": "tui-test",
                    "device_target": "CPU",
                    "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": ranks}],
                    "scheduler": {"port": 18300},
                    "job": {"workdir": str(REPO), "script": RANK, "args": args},
                    "restart": {"max_restarts": max_restarts, "backoff_s": 0.5},
                    "stop": {"grace_s": 2},
                }
            )
        )
        cmd = [
            sys.executable,
            "-m",
            "mscon.console.cli",
            "run",
            "--no-tui",
            "-q",
            str(inv),
            "--run-id",
            f"tui-{name}",
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


if __name__ == "__main__":
    DATA.mkdir(parents=True, exist_ok=True)
    wanted = sys.argv[1:] or list(RUNS)
    for name in wanted:
        if name in RUNS:
            record(name, *RUNS[name])
    if "ok" in wanted:
        with_checks(DATA / "ok.jsonl", DATA / "checks.jsonl")
