"""Stragglers in a real data-parallel job: every rank's step ends in the same AllReduce, so a slow
rank makes all of them slow; the console names it from when each rank arrived with its batch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO, local_inventory, mscon, needs_mindspore, slow_twin

pytestmark = [pytest.mark.mindspore, needs_mindspore]
TRAIN = "trainer/train.py"
# 0.03 s of loading a step on every rank: on 2 busy cores the MLP's own step (a few ms) wanders
# by more than the ratios asked about.
ARGS = [
    "--parallel-mode",
    "data_parallel",
    "--epochs",
    "2",
    "--steps-per-epoch",
    "40",
    "--step-sleep",
    "0.03",
]


def _flags(err: str) -> list[tuple[str, float]]:
    return [
        (m.group(1), float(m.group(2)))
        for m in re.finditer(
            r"^mscon: (r\d+) on local is a straggler from step \d+: .*?([0-9.]+)x", err, re.M
        )
    ]


@pytest.mark.parametrize(
    "slow",
    [
        pytest.param(
            1.0,
            marks=slow_twin("a run nobody slowed flags nobody: test_the_local_default_job_flags_nobody"),
        ),
        1.8,
    ],
)
def test_the_reference_trainer_slowed_on_one_rank_is_named_at_its_factor(tmp_path: Path, slow: float) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, TRAIN, [*ARGS, "--slow-rank", "1", "--slow", str(slow)])
    done = mscon("run", "--no-tui", "-q", "--no-check", inv, "--json", tmp_path / "s.json", cwd=tmp_path)
    assert done.code == 0, done.err[-3000:]
    stragglers = json.loads((tmp_path / "s.json").read_text())["stragglers"]
    if slow == 1.0:
        assert _flags(done.err) == [] and stragglers == [], done.err[-3000:]
        return
    ((name, ratio),) = _flags(done.err)
    assert name == "r1" and 1.5 <= ratio <= 2.2, done.err[-3000:]
    (s,) = stragglers
    assert s["name"] == "r1" and 1.5 <= s["step_time_s"] / s["median_s"] <= 2.2, s


def test_the_local_default_job_flags_nobody(tmp_path: Path) -> None:
    done = mscon(
        "run",
        "--no-tui",
        "-q",
        REPO / "inventory" / "local.yaml",
        "--json",
        tmp_path / "s.json",
        cwd=tmp_path,
    )
    assert done.code == 0, done.err[-3000:]
    assert "straggler" not in done.err, done.err[-3000:]
    assert json.loads((tmp_path / "s.json").read_text())["stragglers"] == []
