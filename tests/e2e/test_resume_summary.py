"""An unmodified MindSpore script's restart is reported as "started over": the real script
(tests/e2e/user_mindspore_script.py, no resume of its own), 2 local ranks, ``--max-restarts 1``,
r1 killed with SIGKILL in attempt 0; attempt 1 trains from its first step again, and the headless
summary and --json say that the script does not resume, with the one-line fix."""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path

import psutil
import pytest
from conftest import REPO, free_port, mscon_popen, needs_mindspore, run_processes, wait_for, write_inventory

SCRIPT = "tests/e2e/user_mindspore_script.py"


def _rank(run_id: str, rank: int, timeout: float) -> psutil.Process:
    """The run's worker process of global rank ``rank`` (RANK_ID), once it has started."""

    def found() -> psutil.Process | None:
        for p in run_processes(run_id):
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if env.get("MS_ROLE") == "MS_WORKER" and env.get("RANK_ID") == str(rank):
                return p
        return None

    return wait_for(found, timeout, f"rank {rank} of {run_id} to start")


@pytest.mark.mindspore
@needs_mindspore
def test_an_unmodified_script_restart_is_said_to_start_over(tmp_path: Path) -> None:
    inv = write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "resume-summary",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": 2}],
            "scheduler": {"port": free_port()},
            "job": {"workdir": str(REPO), "script": SCRIPT, "args": []},
            "stop": {"grace_s": 2},
            "restart": {"backoff_s": 0.2},
        },
    )
    run_id = f"resume-{secrets.token_hex(3)}"
    proc = mscon_popen(
        "run", "--no-tui", "-q", "--no-check", inv, "--run-id", run_id, "--max-restarts", "1",
        "--json", tmp_path / "s.json", "--logs-dir", tmp_path / "runs", cwd=tmp_path,
    )  # fmt: skip
    try:
        os.kill(_rank(run_id, 1, 120).pid, signal.SIGKILL)  # attempt 0's r1
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    assert "r1 on local failed: killed by SIGKILL" in err, err[-4000:]
    assert "[local r1] epoch: 1 step: 1, loss is" in out  # attempt 1 trained again from its first step
    summary = err[err.index(f"mscon: run {run_id} succeeded") :]
    line = next((s for s in summary.splitlines() if s.startswith("attempt 1: ")), None)
    assert line == (
        "attempt 1: the script started over: it does not resume (one line fixes it: wrap the loop in "
        'mscon_resume, see docs/usage.md "Resume your own script")'
    ), summary
    assert "attempt 0: " not in summary  # the first attempt starts at the beginning: no line
    doc = json.loads((tmp_path / "s.json").read_text())
    a0, a1 = doc["attempts"]
    assert (a0["outcome"], a1["outcome"]) == ("failed", "succeeded")
    assert a1["resume"]["verdict"] == "started over"
    assert [(r["name"], r["source"], r["first_epoch"], r["first_step"]) for r in a1["resume"]["ranks"]] == [
        ("r0", "started over", 1, 1),
        ("r1", "started over", 1, 1),
    ]
