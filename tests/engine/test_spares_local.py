"""Spare processes (agent/spares.py): the next attempt's ranks, started ahead with MindSpore imported.

End to end on the local transport with the real agent: attempt 0's ranks start cold, and the agent
starts a spare per process with them (a cold attempt's spares start with it, issue 43); rank 1 fails
at its first step, before rank 0 has stepped (an early fault: spares started once every rank had
stepped would never have started), and attempt 1's processes are the spares, become the ranks:
MindSpore already in ``sys.modules`` before the script imported anything, and everything else (argv
with the resume args, environment, folder, ``__main__``, ``sys.path[0]``, log file, exit code) as a
cold start gives it."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
from conftest import free_port, mindspore_missing, mscon, node_run_dir, write_inventory
from mscon.agent import layout

SCRIPT = """\
import os, sys, time
warm = "mindspore" in sys.modules  # this script never imports it: only a spare has it already
attempt = int(os.environ["MSCON_ATTEMPT"])
rank = os.environ.get("RANK_ID", "sched")
print("warm=%s attempt=%s argv=%s name=%s path0=%s cwd=%s rank=%s" % (
    warm, attempt, sys.argv[1:], __name__, sys.path[0], os.getcwd(), rank), flush=True)
if attempt == 0 and rank == "0":
    time.sleep(2.0)  # rank 1's fault comes before this rank's first step
for step in range(1, 61):
    print("epoch: 1 step: %d, loss is 0.5" % step, flush=True)
    if attempt == 0 and rank == "1":
        sys.exit(3)  # at its first step: 0 s into training
    time.sleep(0.05)
"""


def _inventory(tmp_path: Path, max_restarts: int) -> Path:
    (tmp_path / "job.py").write_text(SCRIPT)
    return write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "spares",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": 2}],
            "scheduler": {"port": free_port()},
            "job": {
                "workdir": str(tmp_path),
                "script": "job.py",
                "args": ["--x", "1"],
                "resume_args": ["--again"],
            },
            "stop": {"grace_s": 1},
            # Imported spares: this script never joins a cluster (test_standby.py: joined ones)
            "restart": {"max_restarts": max_restarts, "backoff_s": 5, "standby": "imported"},
        },
    )


def _first_lines(run_id: str, attempt: int) -> dict[str, str]:
    out = {}
    node = node_run_dir(run_id, "local", user=None)  # a local node's agent runs in this HOME
    for name in ("sched", "r0", "r1"):
        with open(layout.log_path(node, attempt, name), encoding="utf-8") as f:
            out[name] = next(line for line in f if line.startswith("warm="))
    return out


@pytest.mark.skipif(mindspore_missing() is not None, reason=str(mindspore_missing()))
def test_a_restart_takes_the_spares_with_mindspore_imported(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, max_restarts=1)
    done = mscon("run", "--no-tui", "-q", inv, "--json", tmp_path / "s.json", cwd=tmp_path)
    assert done.code == 0, done.err
    summary = json.loads((tmp_path / "s.json").read_text())
    run_id = summary["run_id"]
    assert [a["attempt"] for a in summary["attempts"]] == [0, 1]
    cold, warm = _first_lines(run_id, 0), _first_lines(run_id, 1)
    for name, line in cold.items():
        assert line.startswith("warm=False attempt=0 argv=['--x', '1'] name=__main__"), (name, line)
    for name, line in warm.items():
        assert line.startswith("warm=True attempt=1 argv=['--x', '1', '--again'] name=__main__"), (name, line)
        assert f"path0={tmp_path} cwd={tmp_path}" in line
    assert "rank=1" in warm["r1"] and "rank=0" in warm["r0"]
    # A fault at a step, in training: no backoff (the inventory's 5 s is for start-up failures).
    restart = summary["attempts"][1]["phases"]
    assert restart["launched"] - restart["stopped"] < 2.0
    # Nothing of the run is left: no rank, no spare.
    assert not [p for p in psutil.process_iter(["name"]) if p.info["name"] == "mscon-spare"
                and run_id in " ".join(_environ(p))]  # fmt: skip


def _environ(p: psutil.Process) -> list[str]:
    try:
        return [f"{k}={v}" for k, v in p.environ().items()]
    except (psutil.Error, OSError):
        return []


def test_no_spares_without_a_restart_to_come(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, max_restarts=0)
    done = mscon("run", "--no-tui", "-q", inv, "--json", tmp_path / "s.json", cwd=tmp_path)
    assert done.code == 3, done.err
    run_id = json.loads((tmp_path / "s.json").read_text())["run_id"]
    assert not Path(layout.spares_folder(str(node_run_dir(run_id, "local", user=None)))).exists()
