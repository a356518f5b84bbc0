"""The trainer's start-up milestones for real: 2 MindSpore CPU ranks through mscon, and the summary
says when every rank imported MindSpore, joined the cluster, built its data, compiled and stepped,
in that order. No figure is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import local_inventory, mscon, needs_mindspore

pytestmark = [pytest.mark.mindspore, needs_mindspore]
IN_ORDER = ["launched", "spawned", "imported", "joined", "ready", "compiled", "first_step"]


def test_the_trainer_reports_its_start_up_phases_in_order(tmp_path: Path) -> None:
    args = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "16"]
    inv = local_inventory(tmp_path / "inv.yaml", 2, "trainer/train.py", args)
    done = mscon("run", "--no-tui", "-q", inv, "--json", tmp_path / "s.json", cwd=tmp_path, timeout=400)
    assert done.code == 0, done.err[-3000:]
    (attempt,) = json.loads((tmp_path / "s.json").read_text())["attempts"]
    phases = attempt["phases"]
    assert phases["origin"] == "launch"
    values = [phases[n] for n in IN_ORDER]
    assert None not in values, phases
    assert values == sorted(values) and values[0] >= 0, phases
    assert "  0: from the launch: " in done.err and "MindSpore imported +" in done.err
