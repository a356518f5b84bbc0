"""Stragglers as engine events: the watch's verdicts, ClusterState's record of them, the headless lines."""

from __future__ import annotations

import io
import os

from mscon.agent.protocol import Metric, MetricBatch, ProcExited, ProcStarted
from mscon.console.engine.events import (
    AgentEvent,
    AttemptStarted,
    Event,
    JobState,
    RankRef,
    RunFinished,
    RunResult,
    RunStarted,
    StragglerCleared,
    StragglerFlagged,
    StragglerSummary,
    from_json,
    to_json,
)
from mscon.console.engine.state import ClusterState
from mscon.console.engine.stragglers import StepTimes, StragglerPolicy, StragglerWatch
from mscon.console.views.headless.reporter import HeadlessReporter, format_summary


def started(n: int, attempt: int = 0, state: ClusterState | None = None) -> ClusterState:
    """A state whose attempt has ``n`` running workers r0..r(n-1) on node n0."""
    st = state or ClusterState()
    if state is None:
        st.apply(RunStarted(0, "run", "inv.yaml", ("n0",), n, "/tmp/logs"))
    st.apply(AttemptStarted(attempt, tuple(RankRef(f"r{i}", "n0", i) for i in range(n)), "h", 1))
    for i in range(n):
        st.apply(AgentEvent(attempt, ProcStarted("n0", f"r{i}", i, 100 + i, 1, "log")))
    return st


class Run:
    """Feeds a watch (and the state, as the supervisor does) one step of every rank at a time."""

    def __init__(self, n: int, policy: StragglerPolicy) -> None:
        self.n = n
        self.state = started(n)
        self.watch = StragglerWatch(policy, self.state)
        self.step = 0
        self.attempt = 0

    def steps(self, count: int, times: dict[str, float], base: float = 0.1) -> list[Event]:
        out: list[Event] = []
        for _ in range(count):
            self.step += 1
            for i in range(self.n):
                name = f"r{i}"
                m = Metric("n0", name, i, self.step, step_time_s=times.get(name, base), ts=float(self.step))
                self.state.apply(AgentEvent(self.attempt, m))
                for ev in self.watch.observe(self.attempt, m):
                    self.state.apply(ev)
                    out.append(ev)
        return out


def test_a_rank_half_again_as_slow_is_flagged_once_with_its_numbers() -> None:
    run = Run(4, StragglerPolicy(factor=1.2, window=10))
    events = run.steps(20, {"r2": 0.15})
    # Not in the warm-up (3 steps), then from min_samples (8) step times on.
    assert events == [StragglerFlagged(0, "r2", "n0", 11, 0.15, 0.1, 1.2)]
    assert run.state.stragglers() == {"r2"}
    # Under the threshold: nobody, whatever the number of steps.
    quiet = Run(4, StragglerPolicy(factor=1.6, window=10))
    assert quiet.steps(20, {"r2": 0.15}) == []


def test_cleared_when_it_catches_up_but_not_while_it_hovers_at_the_threshold() -> None:
    run = Run(3, StragglerPolicy(factor=1.3, window=5))  # cleared below 1.15x (halfway)
    assert [type(e) for e in run.steps(12, {"r1": 0.2})] == [StragglerFlagged]  # after the warm-up
    assert run.steps(20, {"r1": 0.12}) == []  # 1.2x: under the factor, over the release
    assert run.state.stragglers() == {"r1"}
    cleared = run.steps(10, {"r1": 0.1})
    assert len(cleared) == 1 and isinstance(cleared[0], StragglerCleared) and cleared[0].name == "r1"
    assert cleared[0].step_time_s < 0.115 and cleared[0].median_s == 0.1
    assert run.state.stragglers() == frozenset()
    assert [type(e) for e in run.steps(10, {"r1": 0.2})] == [StragglerFlagged]  # and again
    (summary,) = run.state.straggler_summaries()
    assert (summary.name, summary.flagged, summary.cleared) == ("r1", 2, False)


def test_compared_once_per_round_of_steps_not_per_metric() -> None:
    run = Run(4, StragglerPolicy(factor=1.2, window=10))
    calls = 0
    compare = run.watch._compare

    def counted() -> list[Event]:
        nonlocal calls
        calls += 1
        return compare()

    run.watch._compare = counted  # type: ignore[method-assign]
    run.steps(13, {})
    assert calls == 10  # 40 metrics after the warm-up's 12, one comparison per round of 4


def test_a_batch_counts_as_its_metrics() -> None:
    st = started(2)
    watch = StragglerWatch(StragglerPolicy(factor=1.2, window=10), st)
    events: list[Event] = []
    for i, t in ((0, 0.1), (1, 0.2)):
        batch = MetricBatch(
            "n0",
            f"r{i}",
            i,
            tuple(Metric("n0", f"r{i}", i, s, step_time_s=t, ts=float(s)) for s in range(1, 12)),
        )
        events += watch.observe(0, batch)
    assert [(type(e), e.name) for e in events] == [(StragglerFlagged, "r1")]  # type: ignore[attr-defined]


def test_an_exit_ends_a_straggler_without_a_clear_and_too_few_ranks_change_nothing() -> None:
    run = Run(3, StragglerPolicy(factor=1.2, window=5))
    run.steps(12, {"r2": 0.2})
    assert run.state.stragglers() == {"r2"}
    run.state.apply(AgentEvent(0, ProcExited("n0", "r2", 2, 102, 0, None, None, 5, False)))
    assert run.state.stragglers() == frozenset()  # exited: no longer a current straggler
    assert run.steps(6, {"r2": 0.1}) == []  # no "caught up" for a rank that left
    # With r0 gone too, r1 has nobody to be compared with (min_ranks 2): however slow, no verdict.
    run.state.apply(AgentEvent(0, ProcExited("n0", "r0", 0, 100, 0, None, None, 5, False)))
    assert run.steps(6, {"r1": 0.5}) == []
    (summary,) = run.state.straggler_summaries()
    assert summary.name == "r2" and not summary.cleared


def test_a_new_attempt_starts_from_nothing() -> None:
    run = Run(3, StragglerPolicy(factor=1.2, window=5))
    run.steps(12, {"r0": 0.2})
    run.attempt = 1
    started(3, attempt=1, state=run.state)
    assert run.state.stragglers() == frozenset()  # the state forgets the old attempt's flags
    # The new attempt's warm-up again, then fewer than min_samples steps of it (and no "caught up"
    # for r0: its flag belonged to the attempt before).
    assert run.steps(8, {"r1": 0.2}) == []
    events = run.steps(2, {"r1": 0.2})
    assert [(e.attempt, e.name) for e in events] == [(1, "r1")]  # type: ignore[attr-defined]
    assert [(s.attempt, s.name) for s in run.state.straggler_summaries()] == [(0, "r0"), (1, "r1")]


def test_events_and_the_result_round_trip_through_json() -> None:
    flagged = StragglerFlagged(2, "r7", "n1", 40, 0.3, 0.2, 1.3)
    cleared = StragglerCleared(2, "r7", "n1", 60, 0.21, 0.2)
    assert from_json(to_json(flagged)) == flagged and from_json(to_json(cleared)) == cleared
    summary = StragglerSummary(2, "r7", "n1", 0.3, 0.2, 1, True)
    result = RunResult("run", JobState.SUCCEEDED, 0, "ok", None, (), 1.0, "/l", stragglers=(summary,))
    assert result.to_json()["stragglers"] == [
        {
            "attempt": 2,
            "name": "r7",
            "node": "n1",
            "step_time_s": 0.3,
            "median_s": 0.2,
            "flagged": 1,
            "cleared": True,
        }
    ]
    back = from_json(to_json(RunFinished(2, result)))
    assert isinstance(back, RunFinished) and back.result.stragglers == (summary,)


def test_headless_prints_a_line_when_flagged_and_when_cleared_and_lists_them_in_the_summary() -> None:
    err = io.StringIO()
    with open(os.devnull, "w") as out:
        reporter = HeadlessReporter(out=out, err=err)
        reporter.handle(StragglerFlagged(0, "r3", "n1", 12, 0.15, 0.1, 1.2))
        reporter.handle(StragglerCleared(0, "r3", "n1", 40, 0.101, 0.1))
    lines = err.getvalue().splitlines()
    assert lines == [
        "mscon: r3 on n1 is a straggler from step 12: 0.15 s/step, 1.50x the other ranks' median of "
        "0.1 s (threshold 1.2x)",
        "mscon: r3 on n1 is no longer a straggler at step 40: 0.101 s/step, the other ranks' median 0.1 s",
    ]
    summary = StragglerSummary(0, "r3", "n1", 0.15, 0.1, 2, True)
    text = format_summary(
        RunResult("run", JobState.SUCCEEDED, 0, "ok", None, (), 1.0, "/l", stragglers=(summary,))
    )
    assert "  attempt 0: r3 on n1: 0.15 s/step, 1.50x the others' 0.1 s, flagged 2 times, then caught up" in (
        text
    )
    assert "stragglers" not in format_summary(
        RunResult("run", JobState.SUCCEEDED, 0, "ok", None, (), 1.0, "/l")
    )


def test_reported_step_times_win_over_ones_derived_from_flush_times() -> None:
    times = StepTimes(window=10)
    # Parsed lines carry the time the agent read them (every 0.1 s): the lines of one read are one
    # stretch, timed from the last line of the read before (steps 3-4: 0.1 s for 2 steps).
    for step, ts in ((1, 0.1), (2, 0.1), (3, 0.2), (4, 0.2), (5, 0.3)):
        times.observe(Metric("n0", "r0", 0, step, ts=ts, source="parsed"))
    assert [round(t, 6) for t in times.recent("r0")] == [0.05, 0.1]
    assert times.observe(Metric("n0", "r0", 0, 5, step_time_s=0.05, ts=0.3, source="metrics"))
    assert times.recent("r0") == (0.05,)  # the exact figure, and the coarse ones are gone
    assert not times.observe(Metric("n0", "r0", 0, 6, ts=0.4, source="parsed"))
    assert times.recent("r0") == (0.05,)
