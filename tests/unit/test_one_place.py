"""Facts and steps that live in one place (issue 34): the paths that now share them still work."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from conftest import local_inventory, mscon
from mscon.agent import exit_codes
from mscon.agent.policy import ALL_FINISHED, Outcome, after_restarts
from mscon.console.engine.state import ClusterState
from mscon.console.engine.verdict import attempt_reason
from mscon.console.transport import slurm_dial


def test_the_slurm_dial_runs_from_source_with_the_agents_exit_codes() -> None:
    # Exec'd with no package around it (as the Slurm boot does): its relative imports fail, and
    # the sources sent ahead of it must define what they would have imported.
    names: dict = {"__name__": "mscon_dial"}
    exec(compile(slurm_dial.dial_source(), "mscon_dial", "exec"), names)  # noqa: S102 - our own source
    assert names["INTERRUPTED"] == exit_codes.INTERRUPTED == 130
    assert callable(names["Dial"]) and callable(names["cache_folder"])


def test_a_verdicts_restarts_are_said_one_way() -> None:
    assert after_restarts(0) == ""
    assert after_restarts(1) == " (after 1 restart)"
    assert after_restarts(3) == " (after 3 restarts)"
    # The console's words for a finished attempt are the policy's.
    assert attempt_reason(Outcome.SUCCEEDED, "", ClusterState()) == (ALL_FINISHED, None)


def test_ls_over_the_local_transport_lists_the_nodes_runs(tmp_path: Path) -> None:
    """``mscon ls INVENTORY`` asks each node's agent once in its one-shot "ls" mode (the same
    conversation as ``mscon prune``'s, which test_disk_hygiene covers)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    inv = local_inventory(tmp_path / "inv.yaml", 1, "bench/fake_rank.py", ["--steps", "1", "--rate", "0"])
    run_id = f"ls-{secrets.token_hex(3)}"
    args = ("run", "--no-tui", "-q", "--no-check", inv, "--run-id", run_id, "--logs-dir", tmp_path / "logs")
    done = mscon(*args, cwd=tmp_path, env=env)
    assert done.code == 0, done.err
    listed = mscon("ls", inv, cwd=tmp_path, env=env, timeout=60)
    assert listed.code == 0, listed.err
    row = next((line for line in listed.out.splitlines() if line.startswith(run_id)), None)
    assert row is not None, listed.out
    assert row.split()[1] == "succeeded", row
