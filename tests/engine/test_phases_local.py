"""Where start-up time goes, end to end on the local transport with fast fake ranks (the real agent
reads their phase records): the summary, --json and the headless lines carry every attempt's
breakdown, a launch from the first connection and a restart from the fault. No figure is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import free_port, mscon, write_inventory

FAKE = "bench/fake_rank.py"
# In time order (AttemptPhases' field order); the way down only for a restart.
DOWN = ["detected", "stopped"]
UP = ["connected", "agent_up", "checks_done", "launched", "spawned"]
RANKS = ["imported", "joined", "ready", "compiled", "first_step"]


def _ordered(phases: dict, names: list[str]) -> list[float]:
    values = [phases[n] for n in names if phases[n] is not None]
    assert values == sorted(values), phases
    return values


def test_every_attempt_says_where_its_start_up_went(tmp_path: Path) -> None:
    args = ["--steps", "400", "--rate", "50", "--metrics", "--phases", "--fail-rank", "1", "--fail-step", "5"]
    inv = write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "phases",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": 2}],
            "scheduler": {"port": free_port()},
            "job": {"workdir": str(Path(__file__).resolve().parents[2]), "script": FAKE, "args": args},
            "stop": {"grace_s": 2},
            "restart": {"max_restarts": 1, "backoff_s": 0.2},
        },
    )
    done = mscon("run", "--no-tui", "-q", inv, "--json", tmp_path / "s.json", cwd=tmp_path)
    assert done.code == 3, done.err  # rank 1 fails at step 5 in both attempts
    attempts = json.loads((tmp_path / "s.json").read_text())["attempts"]
    assert [a["attempt"] for a in attempts] == [0, 1]
    launch, restart = attempts[0]["phases"], attempts[1]["phases"]
    assert launch["origin"] == "launch" and restart["origin"] == "fault"
    # The launch: every milestone known (the console's, the agent's, the ranks' own records), in order.
    assert [n for n in UP + RANKS if launch[n] is None] == []
    assert launch["detected"] is None and launch["stopped"] is None
    assert _ordered(launch, UP + RANKS)[0] >= 0
    # The restart: from the fault, through the stop and the backoff, to every rank's first step.
    required = ["stopped", "launched", "spawned", *RANKS]
    assert [n for n in required if restart[n] is None] == []
    assert (restart["connected"], restart["agent_up"], restart["checks_done"]) == (None, None, None)
    assert _ordered(restart, DOWN + UP + RANKS)[0] >= 0
    # The headless summary: one line per attempt.
    lines = done.err.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("start-up, per attempt"))
    assert lines[head + 1].startswith("  0: from the launch: connected +")
    assert lines[head + 1].endswith(" s to first step")
    assert lines[head + 2].startswith("  1: from the fault: ") and "backoff +" in lines[head + 2]
