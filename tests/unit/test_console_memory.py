"""What the console keeps per rank, and what its end summary costs, at 10,000 nodes x 8 ranks
(issue 44: the console's RSS under 500 MiB). Counted, never timed."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from mscon.agent.protocol import Metric, ProcExited, ProcStarted
from mscon.console.engine import events, summary
from mscon.console.engine.bus import EventBus
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptStarted,
    Event,
    JobState,
    RankRef,
    RunFinished,
    RunStarted,
    json_default,
)
from mscon.console.engine.log_tail import LogTail
from mscon.console.engine.loss_history import LossHistory, limit_for
from mscon.console.engine.state import ClusterState
from mscon.console.engine.state_views import HISTORY, HISTORY_BUDGET, RankView


def _state(ranks: int, steps: int = 3) -> ClusterState:
    nodes = tuple(f"n{i}" for i in range(ranks // 8))
    refs = tuple(RankRef(f"r{i}", nodes[i // 8], i) for i in range(ranks))
    st = ClusterState()
    evs: list[Event] = [
        RunStarted(0, "run", "inv.yaml", nodes, ranks, "/tmp/x"),
        AttemptStarted(0, refs, "h", 1, 1),
    ]
    evs += [AgentEvent(0, ProcStarted(r.node, r.name, r.rank, 100 + r.rank, 2, "/tmp/l")) for r in refs]
    for s in range(1, steps + 1):
        evs += [AgentEvent(0, Metric(r.node, r.name, r.rank, step=s, loss=1.0 / s, epoch=1)) for r in refs]
    evs += [
        AgentEvent(
            0,
            ProcExited(
                r.node,
                r.name,
                r.rank,
                100 + r.rank,
                1 if r.rank == 3 else None,
                None if r.rank == 3 else "SIGTERM",
                9,
                5,
                r.rank != 3,
            ),
        )
        for r in refs
    ]
    evs.append(AttemptEnded(0, AttemptOutcome.FAILED, "r3 failed", None, 9))
    for ev in evs:
        st.apply(ev)
    return st


def test_the_loss_history_is_a_ring_of_the_last_points_in_order() -> None:
    h = LossHistory(4)
    assert len(h) == 0 and list(h) == []
    for s in range(1, 4):
        h.append((s, s / 2))
    assert list(h) == [(1, 0.5), (2, 1.0), (3, 1.5)]
    for s in range(4, 11):
        h.append((s, s / 2))
    assert len(h) == 4 and list(h) == [(7, 3.5), (8, 4.0), (9, 4.5), (10, 5.0)]


def test_a_ranks_plot_points_cost_16_bytes_each_not_a_tuple_each() -> None:
    """A deque of (step, loss) tuples was ~110 bytes a point: 4.5 GB at 80,000 ranks x 512."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        views = [RankView(f"r{i}", "n", i) for i in range(200)]
        for v in views:
            for s in range(HISTORY):
                v.history.append((s + 1000, 0.1 * s))  # steps past the small ints Python shares
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(views[0].history) == HISTORY
    per_point = (used - 200 * 400) / (200 * HISTORY)  # less each view's own fields and tail
    assert per_point < 20, per_point


def test_at_scale_each_rank_keeps_fewer_points_within_the_budget() -> None:
    assert limit_for(1_000, HISTORY_BUDGET, HISTORY) == HISTORY
    assert limit_for(80_001, HISTORY_BUDGET, HISTORY) == 64  # never fewer: a plot still shows a trend
    n = 20_000
    keep = limit_for(n, HISTORY_BUDGET, HISTORY)
    assert 64 < keep < HISTORY and keep * n <= HISTORY_BUDGET
    st = _state(n, steps=1)
    assert {r.history.limit for r in st.ranks.values()} == {keep}


def test_the_end_summary_is_written_without_a_tree_of_every_ranks_dicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JSON is the one ``to_json`` gives, byte for byte, but ``dump`` (a dict per rank summary,
    twice per rank, all alive at once before json.dumps) is not run over the ranks."""
    st = _state(4_000)
    res = summary.run_result(st, "run", tmp_path, JobState.FAILED, 1, "r3 failed", 1.0, EventBus())
    assert len(res.ranks) == 4_000 and len(res.attempts[0].ranks) == 4_000
    expected = json.dumps(res.to_json(), indent=2) + "\n"
    calls = 0
    real = events.dump

    def counted(value: object) -> object:
        nonlocal calls
        calls += 1
        return real(value)

    monkeypatch.setattr(events, "dump", counted)
    path = tmp_path / "summary.json"
    summary.write_summary(path, res, preflight={"ok": True})
    assert calls < 100, calls  # before: one call per field of every rank's summary
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc.pop("preflight") == {"ok": True}
    assert json.dumps(doc, indent=2) + "\n" == expected


def test_a_recorded_event_is_the_json_to_json_gives() -> None:
    st = _state(16)
    res = summary.run_result(st, "run", Path("/tmp/x"), JobState.FAILED, 1, "r3 failed", 1.0, EventBus())
    for ev in (RunFinished(0, res), AgentEvent(0, ProcStarted("n0", "r0", 0, 1, 2, "/l"))):
        compact = json.dumps(ev, separators=(",", ":"), default=json_default)
        assert compact == json.dumps(events.to_json(ev), separators=(",", ":"))


def test_a_ranks_tail_keeps_its_last_lines_and_costs_nothing_before_one() -> None:
    t = LogTail(3)
    assert not t and list(t) == [] and list(reversed(t)) == [] and "a" not in t
    t.extend(["a", "b"])
    t.append("c")
    t.extend(["d"])
    assert len(t) == 3 and list(t) == ["b", "c", "d"] and list(reversed(t)) == ["d", "c", "b"]
    assert "c" in t and "a" not in t
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        views = [RankView(f"r{i}", "n", i) for i in range(1_000)]
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # An empty deque(maxlen=50) was ~620 bytes a rank before any line; a view is now ~400 in all.
    assert used / len(views) < 500, used / len(views)


def test_preflight_is_added_to_a_large_summary_without_loading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = _state(2_000)
    res = summary.run_result(st, "run", tmp_path, JobState.FAILED, 1, "r3 failed", 1.0, EventBus())
    path, whole = tmp_path / "summary.json", tmp_path / "whole.json"
    summary.write_summary(path, res)
    preflight = {"ok": 3, "failed": ["n1: disk"], "results": [{"node": "n1", "v": [1, {"a": None}]}]}
    summary.write_summary(whole, res, preflight=preflight, extra=[])
    loads = summary.json.loads

    def refuse_big(text: str | bytes) -> object:
        assert len(text) < 1_000, "the whole summary loaded"
        return loads(text)

    monkeypatch.setattr(summary.json, "loads", refuse_big)
    assert summary.add_to_summary(path, preflight=preflight, extra=[])
    assert path.read_bytes() == whole.read_bytes()
    monkeypatch.undo()
    # A key already there, or a file written otherwise: loaded whole, as before.
    assert summary.add_to_summary(path, preflight={"ok": 0})
    assert json.loads(path.read_text(encoding="utf-8"))["preflight"] == {"ok": 0}
    (tmp_path / "small.json").write_text('{"a": 1}', encoding="utf-8")
    assert summary.add_to_summary(tmp_path / "small.json", b=2)
    assert json.loads((tmp_path / "small.json").read_text(encoding="utf-8")) == {"a": 1, "b": 2}


def test_a_small_summary_is_written_as_indented_json_and_a_large_one_a_rank_a_line(tmp_path: Path) -> None:
    """Up to summary.BIG members a list, the bytes of ``json.dump(indent=2)``; past it, each of a big
    list's members on a line of its own, written by json's C encoder (its indented output is pure
    Python: seconds of CPU at the end of a 1,000-node run)."""
    small = summary.run_result(_state(16), "run", tmp_path, JobState.FAILED, 1, "r3 failed", 1.0, EventBus())
    summary.write_summary(tmp_path / "small.json", small, preflight={"ok": True})
    expected = json.dumps({**small.to_json(), "preflight": {"ok": True}}, indent=2) + "\n"
    assert (tmp_path / "small.json").read_text(encoding="utf-8") == expected
    ranks = summary.BIG + 8
    big = summary.run_result(_state(ranks), "run", tmp_path, JobState.FAILED, 1, "r3 failed", 1.0, EventBus())
    summary.write_summary(tmp_path / "big.json", big)
    text = (tmp_path / "big.json").read_text(encoding="utf-8")
    assert json.loads(text) == json.loads(json.dumps(big.to_json()))
    lines = text.splitlines()
    run_ranks = lines.index('  "ranks": [')
    assert all(
        json.loads(line.strip().rstrip(","))["name"] == f"r{i}"
        for i, line in enumerate(lines[run_ranks + 1 : run_ranks + 1 + ranks])
    )
    # an attempt's ranks too, below the attempt's own fields
    assert sum(line.strip().startswith('{"node": "n') for line in lines) == 2 * ranks
