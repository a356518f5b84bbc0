"""The console's side of the batches and its per-message hot paths: a MetricBatch or TelemetryBatch
leaves every view exactly as the messages one by one would, in order, with nothing lost."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

from mscon.agent import protocol as P
from mscon.console.engine.bus import EventBus
from mscon.console.engine.events import AgentEvent, AttemptStarted, RankRef, RunStarted
from mscon.console.engine.state import ClusterState
from mscon.console.engine.state_views import RankView
from mscon.console.engine.stragglers import StepTimes, StragglerPolicy, find_stragglers, stragglers_of
from mscon.console.views.headless.reporter import HeadlessReporter

NODE = "n1"
RANKS = [RankRef("sched", NODE, -1)] + [RankRef(f"r{i}", NODE, i) for i in range(4)]


def _state() -> ClusterState:
    st = ClusterState()
    st.apply(RunStarted(0, "run", "inv.yaml", (NODE,), 4, "/tmp/logs"))
    st.apply(AttemptStarted(0, tuple(RANKS), "127.0.0.1", 8118, 1))
    return st


def _metrics(name: str, rank: int, steps: range) -> tuple[P.Metric, ...]:
    return tuple(
        P.Metric(NODE, name, rank, step=s, loss=1.0 / s, epoch=1, step_time_s=0.1 * s, ts=100.0 + s)
        for s in steps
    )


def _views(st: ClusterState) -> dict[str, dict[str, object]]:
    def plain(r: RankView) -> dict[str, object]:
        d = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
        d["tail"], d["history"] = list(r.tail), list(r.history)
        return d

    return {name: plain(r) for name, r in st.ranks.items()}


def test_a_metric_batch_is_applied_as_its_metrics_one_by_one() -> None:
    one, batched = _state(), _state()
    for s in range(1, 30, 7):
        steps = range(s, s + 7)
        for m in _metrics("r1", 1, steps):
            one.apply(AgentEvent(0, m))
        batched.apply(AgentEvent(0, P.MetricBatch(NODE, "r1", 1, _metrics("r1", 1, steps))))
    assert _views(one) == _views(batched)
    assert [s for s, _ in batched.ranks["r1"].history] == list(range(1, 36))


def test_a_telemetry_batch_is_applied_as_its_items() -> None:
    items = tuple(
        P.Telemetry(NODE, f"r{i}", i, 10.0 * i, 2**20 * i, 5.0, 50.0, 2**30, 2**34) for i in range(4)
    )
    one, batched = _state(), _state()
    for t in items:
        one.apply(AgentEvent(0, t))
    batched.apply(AgentEvent(0, P.TelemetryBatch(NODE, items)))
    assert _views(one) == _views(batched)
    assert batched.ranks["r3"].cpu_percent == 30.0


def test_workers_succeeded_counts_each_worker_once() -> None:
    st = _state()

    def exited(name: str, rank: int, code: int) -> None:
        st.apply(AgentEvent(0, P.ProcExited(NODE, name, rank, 1, code, None, None, 1, False)))

    for i in range(3):
        exited(f"r{i}", i, 0)
    exited("r2", 2, 0)  # the same rank reported twice does not stand in for r3
    exited("sched", -1, 0)
    assert not st.workers_succeeded()
    exited("r3", 3, 1)
    assert not st.workers_succeeded()
    exited("r3", 3, 0)
    assert st.workers_succeeded()


def test_the_reporter_prints_a_batch_line_by_line_with_its_prefix(tmp_path: Path) -> None:
    out_path = tmp_path / "out.txt"

    async def main() -> None:
        with open(out_path, "w") as out, open(tmp_path / "err.txt", "w") as err:
            rep = HeadlessReporter(out=out, err=err)
            bus = EventBus()
            bus.add_sink("reporter", rep.handle)
            bus.publish(AgentEvent(0, P.LogBatch(NODE, "r1", 1, 0, ("a", "", "ünï \x1b[1m"), 1)))
            bus.publish(AgentEvent(0, P.LogBatch(NODE, "r2", 2, 0, (), 1)))
            bus.publish(AgentEvent(0, P.LogBatch(NODE, "r2", 2, 0, ("b",), 1)))
            await bus.close()
            assert rep.writer.drain()

    asyncio.run(main())
    assert out_path.read_text() == "[n1 r1] a\n[n1 r1] \n[n1 r1] ünï \x1b[1m\n[n1 r2] b\n"


def test_metric_batches_are_what_a_lagging_view_may_skip() -> None:
    bus = EventBus()
    sub = bus.subscribe("slow", lag_limit=1, hard_limit=100)
    bus.publish(AgentEvent(0, P.LogBatch(NODE, "r1", 1, 0, ("a",), 1)))
    bus.publish(AgentEvent(0, P.MetricBatch(NODE, "r1", 1, _metrics("r1", 1, range(1, 3)))))
    bus.publish(AgentEvent(0, P.TelemetryBatch(NODE, ())))
    bus.publish(AgentEvent(0, P.LogBatch(NODE, "r1", 1, 1, ("b",), 2)))
    assert sub.dropped == 2 and len(sub._items) == 2  # the log lines are kept


def test_cached_medians_give_the_stragglers_the_samples_give() -> None:
    rnd = random.Random(7)
    policy = StragglerPolicy(window=5)
    times = StepTimes(policy.window)
    names = [f"r{i}" for i in range(40)]
    for step in range(1, 30):
        for i, name in enumerate(names):
            slow = 1.6 if i in (3, 17) and step > 10 else 1.0
            msg = P.Metric(NODE, name, i, step=step, step_time_s=0.1 * slow * rnd.uniform(0.95, 1.05))
            times.observe(msg)
        live = names[: 20 + step % 20]
        assert stragglers_of(times, live, policy) == find_stragglers(times.samples(live), policy)
    assert stragglers_of(times, names, policy) == {"r3", "r17"}
    times.reset()
    assert stragglers_of(times, names, policy) == frozenset()


def test_lines_shown_by_the_detaching_console_carry_on_the_count() -> None:
    """An attach starts each rank's count where the detaching console stopped printing (its record),
    through the reducer: the replay that follows is not a gap, and a later detach records at least
    as far, even when no line came meanwhile."""
    from mscon.console.engine.events import LinesShown, from_json, to_json

    st = _state()
    shown = LinesShown(0, (("r0", 120), ("r1", 7), ("nobody", 3)))
    assert from_json(to_json(shown)) == shown
    st.apply(shown)
    assert (st.ranks["r0"].next_seq, st.ranks["r1"].next_seq) == (120, 7)
    st.apply(AgentEvent(0, P.LogBatch(NODE, "r0", 0, seq=120, lines=("a", "b"), ts_ns=2)))
    assert (st.ranks["r0"].next_seq, st.ranks["r0"].lost_lines) == (122, 0)
    st.apply(LinesShown(0, (("r0", 5),)))  # never backwards
    assert st.ranks["r0"].next_seq == 122
