"""Replica consistency: the odd rank out is flagged once, and only when every rank has reported."""

from __future__ import annotations

from mscon.console.engine.replicas import ReplicaWatch


def test_agreeing_replicas_are_quiet() -> None:
    w = ReplicaWatch(3)
    assert all(w.observe(r, 10, "abc") is None for r in ("r0", "r1", "r2"))
    assert w.flagged == set()


def test_the_odd_rank_is_flagged_once() -> None:
    w = ReplicaWatch(4)
    assert w.observe("r0", 10, "a") is None
    assert w.observe("r3", 10, "b") is None  # not everyone has reported yet
    assert w.observe("r1", 10, "a") is None
    d = w.observe("r2", 10, "a")
    assert d is not None and d.ranks == ("r3",) and d.majority == "a" and d.step == 10
    for r in ("r0", "r1", "r2"):
        w.observe(r, 20, "c")
    assert w.observe("r3", 20, "d") is None  # already flagged


def test_no_majority_flags_everyone() -> None:
    w = ReplicaWatch(2)
    w.observe("r0", 5, "x")
    d = w.observe("r1", 5, "y")
    assert d is not None and d.ranks == ("r0", "r1")
