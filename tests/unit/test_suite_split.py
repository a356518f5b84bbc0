"""bench/suite_split.py's simulation of the rank slots, which decides the suite's MindSpore groups."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from suite_split import load, simulate, split_chains  # noqa: E402


def test_two_groups_of_two_slot_tests_run_side_by_side() -> None:
    assert simulate([[(2, 10.0), (2, 5.0)], [(2, 7.0)]], [], 4) == 15.0


def test_a_four_slot_test_waits_for_the_other_group_and_holds_it_up() -> None:
    # b's 4-slot test starts once a's first test ends (10 s); a's second waits for it (till 30 s)
    assert simulate([[(2, 10.0), (2, 5.0)], [(4, 20.0)]], [], 4) == 35.0


def test_first_come_first_served_a_waiting_test_holds_the_gate() -> None:
    # a's 4-slot test (queued at 1 s) goes before b's second 2-slot test (queued at 3 s)
    assert simulate([[(2, 1.0), (4, 10.0)], [(2, 3.0), (2, 1.0)]], [], 4) == 14.0


def test_slots_held_outside_the_groups_are_respected() -> None:
    assert simulate([[(2, 4.0)], [(2, 4.0)]], [], 4) == 4.0
    assert simulate([[(2, 4.0)], [(2, 4.0)]], [(0.0, 10.0, 2)], 4) == 8.0  # one at a time beside them


def test_more_slots_than_there_are_is_capped_not_an_endless_wait() -> None:
    assert simulate([[(6, 3.0)]], [], 4) == 3.0


def test_a_timeline_loads_slot_holders_less_their_set_up(tmp_path: Path) -> None:
    rows = [
        {
            "id": "tests/e2e/test_x.py::t@mindspore-a",
            "start": 100.0,
            "end": 130.0,
            "slots": 2,
            "slot_limit": 4,
            "setup": 12.0,
        },
        {
            "id": "tests/e2e/test_y.py::u@slurm",
            "start": 101.0,
            "end": 111.0,
            "slots": 2,
            "slot_limit": 4,
            "setup": 0.5,
        },
        {"id": "tests/unit/test_z.py::v", "start": 99.0, "end": 99.5, "slots": 0, "call": 0.5},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (x, y), limit = load(path)
    assert limit == 4
    assert (x.module, x.group, x.slots) == ("tests/e2e/test_x.py", "mindspore-a", 2)
    assert (x.start, x.seconds) == (1.0, 18.0)
    assert (y.group, y.start) == ("slurm", 2.0) and y.seconds == pytest.approx(9.5)
    first, second = split_chains([x, y], frozenset({"tests/e2e/test_y.py"}))
    assert (first, second) == ([y], [x])


def test_a_timeline_without_the_slot_limit_is_refused_not_guessed(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps({"id": "tests/e2e/test_x.py::t@mindspore-a", "start": 1.0, "end": 2.0, "slots": 2})
    )
    with pytest.raises(SystemExit, match="no one rank-slot limit"):
        load(path)
