"""Where each attempt's ranks started (console/engine/resume.py): the resume record a rank writes to
MSCON_METRICS read by the agent (agent/metrics.py), the state's per-rank facts, the one verdict,
and the words the summary prints."""

from __future__ import annotations

import json

import pytest
from mscon.agent import protocol as P
from mscon.agent.metrics import record_from_line, resume_from_line
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptStarted,
    Event,
    JobState,
    RankRef,
    RankStart,
    ResumeVerdict,
    RunFinished,
    RunResult,
    RunStarted,
    StartSource,
    from_json,
    result_from_json,
    to_json,
)
from mscon.console.engine.resume import FIX, describe_resume, rank_start, verdict
from mscon.console.engine.state import ClusterState
from mscon.console.views.headless.reporter import format_summary

REFS = (RankRef("sched", "a", -1), RankRef("r0", "a", 0), RankRef("r1", "b", 1))

# ------------------------------------------------------------------ the record, on the agent


def test_a_resume_record_becomes_a_rank_resumed() -> None:
    line = '{"resume": {"step": 150, "epoch": 3, "source": "snapshot"}, "ts": 1700000000.5}'
    got = resume_from_line("n", "r1", 1, line)
    assert got == P.RankResumed(
        node="n", name="r1", rank=1, step=150, source="snapshot", epoch=3, ts_ns=1_700_000_000_500_000_000
    )
    assert record_from_line("n", "r1", 1, line) == got  # the agent's one call for non-metric lines
    assert record_from_line("n", "r1", 1, '{"phase": "joined", "ts": 1.0}') == P.RankPhase(
        "n", "r1", 1, "joined", 1_000_000_000
    )
    wire = P.encode(got)  # type: ignore[arg-type]
    assert wire == (
        '{"type":"rank_resumed","node":"n","name":"r1","rank":1,"step":150,"source":"snapshot",'
        '"epoch":3,"ts_ns":1700000000500000000}\n'
    )
    assert P.decode(wire) == got
    assert got is not None and got.journaled and not (got.streamed or got.sampled or got.reported)


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ('{"resume": {"step": 0, "source": "none"}, "ts": 2}', (0, "none", None)),
        ('{"resume": {"step": 40, "epoch": "3", "source": "checkpoint"}, "ts": 2}', (40, "checkpoint", None)),
        ('{"resume": {"step": 40, "source": "disk"}, "ts": 2}', None),  # not a source we know
        ('{"resume": {"step": -1, "source": "snapshot"}, "ts": 2}', None),
        ('{"resume": {"step": true, "source": "snapshot"}, "ts": 2}', None),
        ('{"resume": {"step": 1.5, "source": "snapshot"}, "ts": 2}', None),
        ('{"resume": {"source": "snapshot"}, "ts": 2}', None),
        ('{"resume": "snapshot", "ts": 2}', None),
        ('["resume"]', None),
        ('{"step": 3, "loss": 0.5, "ts": 2}', None),  # a metric
        ('{"resume": {"step": 40, "source": "snap', None),  # a line a killed rank cut short
    ],
)
def test_only_a_well_formed_resume_record_counts(line: str, want: tuple | None) -> None:
    got = resume_from_line("n", "r0", 0, line)
    if want is None:
        assert got is None
    else:
        assert got is not None and (got.step, got.source, got.epoch) == want


def test_a_resume_record_without_a_time_is_stamped_when_read() -> None:
    got = resume_from_line("n", "r0", 0, '{"resume": {"step": 5, "source": "snapshot"}}')
    assert got is not None and got.ts_ns > 1_600_000_000 * 10**9


# ------------------------------------------------------------------ one rank, then the attempt


def resumed(name: str, step: int, source: str = "snapshot", epoch: int | None = None) -> P.RankResumed:
    return P.RankResumed("a", name, int(name[1:]), step, source, epoch, 1)


def start(name: str, source: StartSource, step: int | None = None) -> RankStart:
    return RankStart(name, "a", int(name[1:]), source, step)


def test_a_rank_that_stepped_without_a_record_started_over() -> None:
    # A record says it: whatever the first step.
    s = rank_start("r0", "a", 0, resumed("r0", 150, epoch=3), True, (3, 151), (0, 1))
    assert (s.source, s.step, s.epoch, s.first_step, s.first_epoch) == (StartSource.SNAPSHOT, 150, 3, 151, 3)
    assert rank_start("r0", "a", 0, resumed("r0", 0, "none"), False, None, None).source is StartSource.FRESH
    # No record: started over, where its first step is no later than the first attempt's.
    assert rank_start("r0", "a", 0, None, True, (1, 1), (1, 1)).source is StartSource.STARTED_OVER
    assert (
        rank_start("r0", "a", 0, None, True, None, None).source is StartSource.STARTED_OVER
    )  # first step only
    assert rank_start("r0", "a", 0, None, True, (None, 0), None).source is StartSource.STARTED_OVER
    # ... or it went on by itself (its own checkpoint, through job.resume_args).
    assert rank_start("r0", "a", 0, None, True, (None, 151), (None, 1)).source is StartSource.UNRECORDED
    assert rank_start("r0", "a", 0, None, True, (2, 3), None).source is StartSource.UNRECORDED
    # Nothing yet.
    assert rank_start("r0", "a", 0, None, False, None, None).source is StartSource.UNKNOWN


@pytest.mark.parametrize(
    ("starts", "want", "step"),
    [
        ([start("r0", StartSource.SNAPSHOT, 150), start("r1", StartSource.SNAPSHOT, 150)], "resumed", 150),
        ([start("r0", StartSource.SNAPSHOT, 150), start("r1", StartSource.CHECKPOINT, 150)], "resumed", 150),
        ([start("r0", StartSource.SNAPSHOT, 150), start("r1", StartSource.SNAPSHOT, 140)], "mixed", None),
        ([start("r0", StartSource.SNAPSHOT, 150), start("r1", StartSource.STARTED_OVER)], "mixed", None),
        ([start("r0", StartSource.FRESH, 0), start("r1", StartSource.FRESH, 0)], "fresh", 0),
        ([start("r0", StartSource.FRESH, 0), start("r1", StartSource.SNAPSHOT, 0)], "mixed", None),
        (
            [start("r0", StartSource.STARTED_OVER), start("r1", StartSource.STARTED_OVER)],
            "started over",
            None,
        ),
        ([start("r0", StartSource.STARTED_OVER), start("r1", StartSource.UNKNOWN)], "started over", None),
        ([start("r0", StartSource.UNRECORDED), start("r1", StartSource.UNRECORDED)], "unrecorded", None),
        ([start("r0", StartSource.UNKNOWN), start("r1", StartSource.UNKNOWN)], "unknown", None),
        ([], "unknown", None),
    ],
)
def test_the_attempt_verdict(starts: list[RankStart], want: str, step: int | None) -> None:
    got = verdict(list(reversed(starts)))
    assert (got.verdict, got.step) == (ResumeVerdict(want), step)
    assert [s.name for s in got.ranks] == [s.name for s in starts]  # in rank order


def test_the_verdict_in_words() -> None:
    both = [start("r0", StartSource.SNAPSHOT, 150), start("r1", StartSource.SNAPSHOT, 150)]
    assert describe_resume(verdict(both)) == "every rank resumed at step 150 (snapshot)"
    over = [start("r0", StartSource.STARTED_OVER), start("r1", StartSource.STARTED_OVER)]
    assert describe_resume(verdict(over)) == f"the script started over: it does not resume ({FIX})"
    assert "mscon_resume" in FIX and "Resume your own script" in FIX
    mixed = [start(f"r{i}", StartSource.SNAPSHOT, 150) for i in range(6)] + [
        start("r6", StartSource.STARTED_OVER)
    ]
    assert describe_resume(verdict(mixed)) == (
        "the ranks did not start from the same step: r0, r1, r2, r3 and 2 more resumed at step 150 "
        "(snapshot); r6 started over (no resume record)"
    )
    partly = [start("r0", StartSource.SNAPSHOT, 150), start("r1", StartSource.UNKNOWN)]
    assert (
        describe_resume(verdict(partly))
        == "r0 resumed at step 150 (snapshot); not known for r1 (no first step)"
    )
    fresh = [start("r0", StartSource.FRESH, 0), start("r1", StartSource.FRESH, 0)]
    assert describe_resume(verdict(fresh)).startswith("every rank started at step 0")
    assert "none reached its first step" in describe_resume(verdict([start("r0", StartSource.UNKNOWN)]))


# ------------------------------------------------------------------ the state, the summary, the JSON


def agent(attempt: int, msg: P.Message) -> AgentEvent:
    return AgentEvent(attempt, msg)


def attempt(n: int, body: list[Event], outcome: AttemptOutcome) -> list[Event]:
    return [
        AttemptStarted(n, REFS, "10.0.0.1", 8118, 1),
        *[agent(n, P.ProcStarted(r.node, r.name, r.rank, 100 + n, 1, "/log")) for r in REFS],
        *body,
        AttemptEnded(n, outcome, "why", None, 2),
    ]


def metric(n: int, name: str, step: int, epoch: int | None = None) -> AgentEvent:
    return agent(n, P.Metric("a", name, int(name[1:]), step, 0.5, epoch))


def run(second: list[Event]) -> ClusterState:
    first = [metric(0, "r0", 1), metric(0, "r1", 1), metric(0, "r0", 160), metric(0, "r1", 160)]
    state = ClusterState()
    evs = [
        RunStarted(0, "run", "inv.yaml", ("a", "b"), 2, "/logs", max_restarts=1),
        *attempt(0, first, AttemptOutcome.FAILED),
        *attempt(1, second, AttemptOutcome.SUCCEEDED),
    ]
    for ev in evs:
        state.apply(ev)
    return state


def summary(state: ClusterState) -> RunResult:
    return RunResult(
        "run",
        JobState.SUCCEEDED,
        0,
        "done",
        None,
        state.rank_summaries(),
        3.0,
        "/logs",
        state.attempt_summaries(),
    )


def test_a_resumed_restart_in_the_state_the_summary_and_the_json() -> None:
    second = [
        agent(1, resumed("r0", 150, epoch=3)),
        agent(1, resumed("r1", 150, epoch=3)),
        metric(1, "r0", 151),
        metric(1, "r1", 151),
    ]
    state = run(second)
    a0, a1 = (a.resume for a in state.attempt_summaries())
    assert a0 is not None and a0.verdict is ResumeVerdict.STARTED_OVER  # no record in attempt 0 (no line)
    assert a1 is not None and (a1.verdict, a1.step) == (ResumeVerdict.RESUMED, 150)
    assert [(s.name, s.source, s.step, s.epoch, s.first_step) for s in a1.ranks] == [
        ("r0", StartSource.SNAPSHOT, 150, 3, 151),
        ("r1", StartSource.SNAPSHOT, 150, 3, 151),
    ]  # workers only
    text = format_summary(summary(state))
    assert "\nattempt 1: every rank resumed at step 150 (snapshot)\n" in text
    assert "attempt 0:" not in text  # the first attempt starts at the beginning: no line
    doc = json.loads(json.dumps(summary(state).to_json()))
    r1 = doc["attempts"][1]["resume"]
    assert r1["verdict"] == "resumed" and r1["step"] == 150
    assert r1["ranks"][1] == {
        "name": "r1",
        "node": "b",  # the attempt's, not the message's
        "rank": 1,
        "source": "snapshot",
        "step": 150,
        "epoch": 3,
        "first_step": 151,
        "first_epoch": None,
    }
    assert result_from_json(doc) == summary(state)  # a summary file reads back whole
    ended = RunFinished(1, summary(state))
    assert from_json(json.loads(json.dumps(to_json(ended)))) == ended  # a recording replays it
    said = second[0]
    assert from_json(json.loads(json.dumps(to_json(said)))) == said  # and the message itself


def test_a_restart_of_a_script_that_does_not_resume_started_over() -> None:
    state = run([metric(1, "r0", 1), metric(1, "r1", 1)])
    a1 = state.attempt_summaries()[1].resume
    assert a1 is not None and a1.verdict is ResumeVerdict.STARTED_OVER
    assert {s.source for s in a1.ranks} == {StartSource.STARTED_OVER}
    text = format_summary(summary(state))
    assert f"\nattempt 1: the script started over: it does not resume ({FIX})\n" in text
    assert (
        json.loads(json.dumps(summary(state).to_json()))["attempts"][1]["resume"]["verdict"] == "started over"
    )


def test_a_first_step_phase_counts_and_a_late_record_still_wins() -> None:
    # r0 said only its first step (a journal replay has no metrics); r1's record came after its
    # first metric (the agent read its log before its metrics file): it resumed.
    second = [
        agent(1, P.RankPhase("a", "r0", 0, P.Milestone.FIRST_STEP, 5)),
        metric(1, "r1", 151),
        agent(1, resumed("r1", 150)),
    ]
    a1 = run(second).attempt_summaries()[1].resume
    assert a1 is not None and a1.verdict is ResumeVerdict.MIXED
    assert [s.source for s in a1.ranks] == [StartSource.STARTED_OVER, StartSource.SNAPSHOT]


def test_a_script_that_resumes_by_itself_is_not_said_to_start_over() -> None:
    state = run([metric(1, "r0", 141), metric(1, "r1", 141)])
    a1 = state.attempt_summaries()[1].resume
    assert a1 is not None and a1.verdict is ResumeVerdict.UNRECORDED
    assert "started over" not in format_summary(summary(state))


def test_the_current_attempt_is_told_as_it_goes() -> None:
    state = ClusterState()
    for ev in [
        RunStarted(0, "run", "inv.yaml", ("a", "b"), 2, "/logs", max_restarts=1),
        AttemptStarted(0, REFS, "10.0.0.1", 8118, 1),
        AttemptEnded(0, AttemptOutcome.FAILED, "why", None, 2),
        AttemptStarted(1, REFS, "10.0.0.1", 8118, 3),
    ]:
        state.apply(ev)
    assert state.resume() is not None and state.resume().verdict is ResumeVerdict.UNKNOWN  # type: ignore[union-attr]
    state.apply(agent(1, resumed("r0", 20)))
    assert state.resume().verdict is ResumeVerdict.RESUMED  # type: ignore[union-attr]
    state.apply(metric(1, "r1", 1))
    assert state.resume().verdict is ResumeVerdict.MIXED  # type: ignore[union-attr]
