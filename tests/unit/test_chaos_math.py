"""bench/chaos_math.py: counted steps, steps lost and recovery time from a synthetic timeline."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "chaos_math.py"
_spec = importlib.util.spec_from_file_location("chaos_math", _PATH)
assert _spec is not None and _spec.loader is not None
cm = importlib.util.module_from_spec(_spec)
sys.modules["chaos_math"] = cm  # dataclasses look their module up by name
_spec.loader.exec_module(cm)


def _marks(attempt: int, steps: range, t0: float, dt: float, world: int = 2) -> list:
    """Every rank completes each step dt after the previous one; rank r reports r * 0.01 s late."""
    return [
        cm.StepMark(attempt, r, s, t0 + i * dt + r * 0.01) for i, s in enumerate(steps) for r in range(world)
    ]


def _timeline() -> tuple[dict, list]:
    # attempt 0: steps 1..10 at t=10.0..10.9; killed at 11.0
    # attempt 1: resumes at 8 (steps 9..15 from t=20.0); killed at 21.0
    # attempt 2: resumes at 12 (steps 13..20 from t=30.0): its steps 13..15 redo attempt 1's
    marks = _marks(0, range(1, 11), 10.0, 0.1) + _marks(1, range(9, 16), 20.0, 0.1)
    marks += _marks(2, range(13, 21), 30.0, 0.1)
    faults = [cm.Fault(11.0, 1, 0), cm.Fault(21.0, 0, 1)]
    return cm.attempts(marks, world=2), faults


def test_attempts_resume_points_and_all_ranks_first_step() -> None:
    runs, _ = _timeline()
    assert [(a.number, a.resumed_at, a.last) for a in runs.values()] == [(0, 0, 10), (1, 8, 15), (2, 12, 20)]
    assert runs[1].first_step_all == pytest.approx(20.01)  # the slower rank's first step
    assert runs[0].done[1] == pytest.approx(10.01)


def test_counted_steps_drop_what_a_later_attempt_redid() -> None:
    runs, _ = _timeline()
    assert cm.counted_steps(runs) == {0: list(range(1, 9)), 1: list(range(9, 13)), 2: list(range(13, 21))}


def test_a_lower_resume_later_on_discards_an_earlier_attempts_steps() -> None:
    # attempt 2 resumed at 5 (e.g. from an older checkpoint): attempt 1's 6..9 are lost as well
    marks = _marks(0, range(1, 8), 0.0, 1.0) + _marks(1, range(7, 10), 10.0, 1.0)
    marks += _marks(2, range(6, 9), 20.0, 1.0)
    assert cm.counted_steps(cm.attempts(marks, 2)) == {0: [1, 2, 3, 4, 5], 1: [], 2: [6, 7, 8]}


def test_fault_costs_and_effective_ratio() -> None:
    runs, faults = _timeline()
    costs = cm.fault_costs(runs, faults)
    assert [(c.last_step, c.resumed_at, c.steps_lost) for c in costs] == [(10, 8, 2), (15, 12, 3)]
    assert [c.recovery_s for c in costs] == pytest.approx([9.01, 9.01])
    # counted: 8 + 4 + 8 steps of 0.1 s each (an attempt's first step counts its median gap)
    assert cm.training_seconds(runs) == pytest.approx(2.0)
    assert cm.effective_ratio(runs, wall_s=40.0) == pytest.approx(0.05)


def test_a_fault_with_no_restart_has_no_recovery() -> None:
    marks = _marks(0, range(1, 6), 0.0, 1.0, world=4)
    marks += [cm.StepMark(1, 0, 5, 9.0)]  # only one of four ranks of the next attempt stepped
    runs = cm.attempts(marks, world=4)
    (never,) = cm.fault_costs(runs, [cm.Fault(5.5, 3, 0)])
    assert never.recovery_s is None and never.steps_lost == 1
    (ended,) = cm.fault_costs(cm.attempts(marks[:-1], 4), [cm.Fault(5.5, 3, 0)])
    assert ended.resumed_at is None and ended.steps_lost is None and ended.recovery_s is None


def test_percentile() -> None:
    assert cm.percentile([], 50) is None
    assert cm.percentile([3.0], 95) == 3.0
    assert cm.percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert cm.percentile(range(1, 101), 95) == pytest.approx(95.05)
