"""The moment the product is named for, in a real terminal (tmux): a rank dies, the operator reads
the Failure panel while every process of the attempt is gone, presses r, and the group trains again
from the trainer's latest snapshot. No restart budget: the run waits for the operator. The standby
cluster had joined before the fault, so the console says the restart will be warm, and it is."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import REPO, free_port, needs_mindspore, run_processes, wait_gone, write_inventory
from mscon.agent import layout
from tmux_screen import capture, keys, wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"
)


@needs_mindspore
@pytest.mark.mindspore
def test_r_after_a_failure_restarts_the_group_from_its_checkpoint(tmp_path: Path) -> None:
    inv = write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "operator-restart",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": 2}],
            "scheduler": {"port": free_port()},
            "job": {
                "workdir": str(REPO),
                "script": "trainer/train.py",
                "args": [
                    "--parallel-mode",
                    "data_parallel",
                    "--epochs",
                    "400",
                    "--steps-per-epoch",
                    "20",
                    "--checkpoint-every",
                    "5",
                ],
                "env": {"GLOG_v": "3"},
            },
            "stop": {"grace_s": 3},
        },
    )
    run_id = f"op-restart-{secrets.token_hex(3)}"
    session = f"mscon-op-{secrets.token_hex(3)}"
    done = tmp_path / "done"
    logs = tmp_path / "runs"
    env = " ".join(f"{k}={v}" for k, v in (("PYTHONPATH", os.environ.get("PYTHONPATH", "")),) if v)
    cmd = (
        f"cd {tmp_path} && env {env} TERM=xterm-256color {sys.executable} -m mscon.console.cli up {inv} "
        f"--no-check --run-id {run_id} --logs-dir {logs} --json {tmp_path / 's.json'}; "
        f"echo exit=$? > {done}; sleep 60"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "45", cmd], check=True)
    try:
        wait_for(session, lambda: "Overview" in capture(session), 60, "the console")

        def ranks_past_a_checkpoint() -> list[psutil.Process]:
            ranks = _workers(run_id)
            return ranks if len(ranks) == 2 and _checkpointed(run_id) else []

        ranks = wait_for(
            session, ranks_past_a_checkpoint, 240, "two training ranks past their first checkpoint"
        )
        wait_for(session, lambda: _standby_joined(run_id), 240, "the standby for attempt 1 to join")
        victim = min(ranks, key=lambda p: p.pid)
        victim.kill()  # kill -9
        wait_for(
            session, lambda: "awaiting operator" in capture(session), 60, "the run to wait for the operator"
        )
        # Every process of the failed attempt is gone, and the run still waits: this is when r matters.
        assert wait_gone(ranks, 30) == []
        wait_for(session, lambda: run_processes(run_id) == [], 30, "the scheduler to go")
        assert not done.exists() and "awaiting operator" in capture(session)
        keys(session, "r")
        wait_for(session, lambda: "Restart the whole group?" in capture(session), 20, "the restart question")
        wait_for(
            session,  # toasts may cover the dialog for a moment
            lambda: "It starts warm: every node's standby cluster has joined" in _words(capture(session)),
            20,
            "the question to say the restart starts warm",
        )
        keys(session, "y")
        resumed = wait_for(
            session, lambda: _resumed_step(run_id), 240, "attempt 1 to resume from a checkpoint"
        )
        assert resumed > 0
        wait_for(
            session,
            lambda: len(_workers(run_id)) == 2,
            60,
            "attempt 1's two ranks",
        )
        keys(session, "q")
        wait_for(session, lambda: "Quit mscon?" in capture(session), 20, "the quit question")
        keys(session, "s")
        wait_for(session, done.exists, 90, "mscon to exit")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert done.read_text().strip() == "exit=130"
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [(a["attempt"], a["outcome"]) for a in summary["attempts"]] == [
        (0, "failed"),
        (1, "interrupted"),
    ]
    assert summary["attempts"][0]["root_cause"]["signal"] == "SIGKILL"
    assert summary["attempts"][1]["phases"]["warm"] is True


def _workers(run_id: str) -> list[psutil.Process]:
    """The run's training ranks (the scheduler runs the same script, as MS_SCHED)."""
    found = []
    for p in run_processes(run_id):
        try:
            if p.environ().get("MS_ROLE") == "MS_WORKER":
                found.append(p)
        except psutil.Error:
            continue
    return found


def _standby_joined(run_id: str) -> bool:
    """Every worker's spare for attempt 1 has joined its standby cluster (the agent's markers)."""
    run_dir = str(_node_run_dir(run_id))
    return all(Path(layout.spare_joined(run_dir, name, 1)).exists() for name in ("r0", "r1"))


def _words(screen: str) -> str:
    """The screen's words in reading order, without the dialog's line breaks and borders."""
    return " ".join(re.findall(r"[\w':;,.()]+", screen))


def _node_run_dir(run_id: str) -> Path:
    return Path(layout.run_folder(None, run_id, "local"))  # a local node: the console's own home


def _checkpointed(run_id: str) -> bool:
    return any(Path(layout.checkpoint_folder(str(_node_run_dir(run_id)))).rglob("*.ckpt"))


def _resumed_step(run_id: str) -> int:
    log = Path(layout.log_path(_node_run_dir(run_id), 1, "r0"))
    m = re.search(r"resumed from step (\d+)", log.read_text(errors="replace")) if log.exists() else None
    return int(m.group(1)) if m else 0
