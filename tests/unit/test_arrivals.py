"""Data-parallel stragglers: equal step times, told apart by when each rank arrived with its batch."""

from __future__ import annotations

import random

import pytest
from mscon.agent.protocol import Metric
from mscon.console.engine.arrivals import Arrivals, Work, work_of_step
from mscon.console.engine.events import AgentEvent, StragglerFlagged
from mscon.console.engine.stragglers import StepTimes, StragglerPolicy, StragglerWatch
from test_stragglers import started


def test_the_ranks_that_waited_get_their_step_less_the_wait() -> None:
    # r1 arrived 0.08 s after r0 and r2; every step took 0.2 s (the AllReduce ends it for all).
    got = work_of_step(7, {"r0": (0.2, 10.0), "r1": (0.2, 10.08), "r2": (0.2, 10.0)})
    assert [(w.name, round(w.seconds, 6)) for w in got] == [("r0", 0.12), ("r1", 0.2), ("r2", 0.12)]
    # Clocks that disagree by more than a step never make a negative or a longer step.
    skewed = work_of_step(1, {"a": (0.1, 0.0), "b": (0.1, 5.0)})
    assert [w.seconds for w in skewed] == [0.0, 0.1]


def test_a_step_is_held_until_every_rank_made_it_or_it_is_too_old() -> None:
    arr = Arrivals(reach=3)
    assert arr.add("r0", 1, 0.1, 1.0) == [Work("r0", 1, 0.1)]  # the only rank seen: complete
    assert arr.add("r1", 1, 0.1, 1.0) == []  # too late: its wait is unknown, and nothing waits on it
    assert arr.add("r0", 2, 0.1, 2.0) == []
    assert arr.add("r1", 2, 0.1, 2.05) == [Work("r0", 2, pytest.approx(0.05)), Work("r1", 2, 0.1)]
    # r1 falls silent: r0's steps are given once they are older than the reach.
    for k in range(3, 6):
        assert arr.add("r0", k, 0.1, float(k)) == []
    assert arr.add("r0", 6, 0.1, 6.0) == [Work("r0", 3, 0.1)]
    arr.reset()
    assert arr.add("r0", 9, 0.1, 9.0) == [Work("r0", 9, 0.1)]


@pytest.mark.parametrize("factor", [1.0, 1.5, 1.8])
def test_a_slow_loader_is_named_at_its_own_factor_not_its_waiting_peers(factor: float) -> None:
    # 3 data-parallel ranks, own step 50 ms +-10 %; r1 loads (factor - 1) x that longer before it
    # arrives, and every rank's step ends in the same AllReduce: equal step times for all.
    rnd = random.Random(3)
    st = started(3)
    watch = StragglerWatch(StragglerPolicy(factor=1.3, window=20), st)
    events = []
    t = 1000.0
    for step in range(1, 61):
        own = {f"r{i}": 0.05 * rnd.uniform(0.9, 1.1) for i in range(3)}
        load = {n: 0.005 for n in own}
        load["r1"] += (factor - 1.0) * own["r1"]
        arrive = {n: t + load[n] for n in own}
        end = max(arrive[n] + own[n] - 0.005 for n in own)  # the AllReduce waits for the last
        for i, name in enumerate(own):
            m = Metric(
                "n0", name, i, step, step_time_s=end - t, ts=end, source="metrics", arrive_ts=arrive[name]
            )
            st.apply(AgentEvent(0, m))
            for ev in watch.observe(0, m):
                st.apply(ev)
                events.append(ev)
        t = end
    flagged = [e for e in events if isinstance(e, StragglerFlagged)]
    if factor < 1.3:
        assert flagged == []
    else:
        assert [e.name for e in flagged] == ["r1"]
        ratio = flagged[0].step_time_s / flagged[0].median_s
        assert abs(ratio - factor) / factor < 0.2, ratio


def test_without_arrivals_equal_step_times_name_nobody() -> None:
    # What the console saw before: a data-parallel straggler's peers take as long as it does.
    times = StepTimes(window=10, warmup=0)
    for step in range(1, 20):
        for name in ("r0", "r1"):
            times.observe(Metric("n0", name, 0, step, step_time_s=0.09, ts=float(step), source="metrics"))
    judged = times.judge(["r0", "r1"], 8)
    assert {n: round(a / b, 3) for n, (a, b) in judged.items()} == {"r0": 1.0, "r1": 1.0}
