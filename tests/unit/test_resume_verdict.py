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
from mscon.console.engine.resume import FIX, Reached, describe_resume, frontier, rank_start, verdict
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
        '"epoch":3,"ts_ns":1700000000500000000,"reason":null}\n'
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


REASON = 'keep holds two objects with the parameter beta1_power: pass them as keep={"g": opt_g, "d": opt_d}'


def refusal_line(reason: object = REASON, step: object = 0) -> str:
    body: dict = {"source": "refused", "reason": reason}
    if step is not None:
        body["step"] = step
    return json.dumps({"resume": body, "ts": 1700000000.5})


def test_a_refusal_record_becomes_a_rank_resumed_with_its_reason() -> None:
    got = resume_from_line("n", "r1", 1, refusal_line())
    assert got == P.RankResumed(
        node="n", name="r1", rank=1, step=0, source="refused", ts_ns=1_700_000_000_500_000_000, reason=REASON
    )
    assert record_from_line("n", "r1", 1, refusal_line()) == got
    assert P.decode(P.encode(got)) == got  # type: ignore[arg-type]
    assert json.loads(P.encode(got))["reason"] == REASON  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "want"),
    [
        (refusal_line(step=None), (0, REASON)),  # a refusal starts no step: none needed
        (refusal_line(step=7), (0, REASON)),  # nor taken
        (refusal_line(reason=None), (0, None)),  # a refusal without its reason still counts
        (refusal_line(reason=["a"]), (0, None)),
        (refusal_line(reason="  \n "), (0, None)),
        (refusal_line(reason="two\nlines,\t  and spaces "), (0, "two lines, and spaces")),
        (refusal_line(reason="esc \x1b[31m left"), (0, "esc \x1b[31m left")),  # the views escape it
        (
            '{"resume": {"step": 40, "source": "snapshot", "reason": "why"}, "ts": 2}',
            (40, None),
        ),  # not refused
    ],
)
def test_a_refusals_reason_is_one_line_or_none(line: str, want: tuple) -> None:
    got = resume_from_line("n", "r0", 0, line)
    assert got is not None
    assert (got.step, got.reason) == want


def test_a_long_reason_is_cut_to_the_bound() -> None:
    got = resume_from_line("n", "r0", 0, refusal_line(reason="x" * 5000))
    assert got is not None and got.reason is not None
    assert len(got.reason) == P.RESUME_REASON_MAX and got.reason.endswith("\u2026")
    exact = resume_from_line("n", "r0", 0, refusal_line(reason="y" * P.RESUME_REASON_MAX))
    assert exact is not None and exact.reason == "y" * P.RESUME_REASON_MAX  # at the bound: whole


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


def refused(name: str, reason: str | None = REASON) -> RankStart:
    return RankStart(name, "a", int(name[1:]), StartSource.REFUSED, reason=reason)


def test_a_refused_record_is_a_rank_that_resumed_at_no_step() -> None:
    s = rank_start("r1", "a", 1, P.RankResumed("a", "r1", 1, 0, "refused", reason=REASON), False, None, None)
    assert (s.source, s.step, s.epoch, s.reason) == (StartSource.REFUSED, None, None, REASON)
    plain = rank_start("r1", "a", 1, resumed("r1", 150), True, (None, 151), None)
    assert plain.reason is None


def test_any_refusal_makes_the_attempt_refused() -> None:
    every = verdict([refused("r1", "rank 0 refuses (its log says why)"), refused("r0"), refused("r2")])
    assert (every.verdict, every.step, every.recomputed) == (ResumeVerdict.REFUSED, None, None)
    assert describe_resume(every) == (
        f"rank r0 and 2 other ranks refused to resume: {REASON} (the relaunch stopped before its first step)"
    )
    one = verdict([refused("r0"), refused("r1", "other")])
    assert describe_resume(one).startswith(f"rank r0 and 1 other rank refused to resume: {REASON} (")
    # Only some ranks said: the rest are not known (a refusal stops before the first step).
    alone = verdict([start("r0", StartSource.UNKNOWN), refused("r1")])
    assert alone.verdict is ResumeVerdict.REFUSED
    assert describe_resume(alone) == (
        f"rank r1 refused to resume: {REASON} (the relaunch stopped before its first step); "
        "not known for r0 (no first step)"
    )
    silent = verdict([refused("r0", None)])
    assert describe_resume(silent) == (
        "rank r0 refused to resume, giving no reason (the relaunch stopped before its first step)"
    )


def test_a_refusal_beside_ranks_that_resumed_is_still_refused() -> None:
    mixed = [start("r0", StartSource.SNAPSHOT, 150), refused("r1"), start("r2", StartSource.SNAPSHOT, 150)]
    got = verdict(mixed, 160)
    assert (got.verdict, got.step, got.recomputed) == (ResumeVerdict.REFUSED, None, None)
    # The others did not stop before a step by themselves: they are said as they are, not "stopped".
    assert (
        describe_resume(got) == f"rank r1 refused to resume: {REASON}; r0, r2 resumed at step 150 (snapshot)"
    )
    over = verdict([start("r0", StartSource.STARTED_OVER), refused("r1")])
    assert over.verdict is ResumeVerdict.REFUSED
    assert describe_resume(over).endswith("; r0 started over (no resume record)")


@pytest.mark.parametrize(
    ("reached", "recomputed", "words"),
    [
        (23, 2, "every rank resumed at step 21 (snapshot); 2 steps computed again"),
        (22, 1, "every rank resumed at step 21 (snapshot); 1 step computed again"),
        (21, 0, "every rank resumed at step 21 (snapshot); none computed again"),
        (None, None, "every rank resumed at step 21 (snapshot)"),  # the previous attempt's steps not known
        (
            3,
            None,
            "every rank resumed at step 21 (snapshot)",
        ),  # reports below the resume step explain nothing
    ],
)
def test_the_steps_computed_again(reached: int | None, recomputed: int | None, words: str) -> None:
    both = [start("r0", StartSource.SNAPSHOT, 21), start("r1", StartSource.CHECKPOINT, 21)]
    got = verdict(both, reached)
    assert (got.verdict, got.step, got.recomputed) == (ResumeVerdict.RESUMED, 21, recomputed)
    assert describe_resume(got) == words.replace("(snapshot)", "(checkpoint and snapshot)")


def test_only_a_resumed_attempt_counts_steps_computed_again() -> None:
    fresh = verdict([start("r0", StartSource.FRESH, 0), start("r1", StartSource.FRESH, 0)], 40)
    mixed = verdict([start("r0", StartSource.SNAPSHOT, 21), start("r1", StartSource.SNAPSHOT, 20)], 40)
    over = verdict([start("r0", StartSource.STARTED_OVER)], 40)
    assert [v.recomputed for v in (fresh, mixed, over)] == [None, None, None]
    assert "computed again" not in " ".join(describe_resume(v) for v in (fresh, mixed, over))


@pytest.mark.parametrize(
    ("earlier", "want"),
    [
        ([], None),  # the first attempt: nothing before it
        ([Reached(0, ResumeVerdict.STARTED_OVER, (None, 23, 21))], 23),  # the largest any rank reported
        ([Reached(0, None, (5,)), Reached(1, ResumeVerdict.RESUMED, (30, 31))], 31),  # the previous one
        # A refused (or never started) previous attempt computed nothing: the one before counts.
        ([Reached(0, ResumeVerdict.FRESH, (23,)), Reached(1, ResumeVerdict.REFUSED, (None, None))], 23),
        (
            [
                Reached(0, ResumeVerdict.FRESH, (23,)),
                Reached(1, ResumeVerdict.UNKNOWN, ()),
                Reached(2, ResumeVerdict.REFUSED, (None,)),
            ],
            23,
        ),
        # ... but one that stepped without reporting a step (a journal replay has no metrics) is not known.
        ([Reached(0, ResumeVerdict.FRESH, (23,)), Reached(1, ResumeVerdict.STARTED_OVER, (None,))], None),
        ([Reached(0, ResumeVerdict.FRESH, (23,)), Reached(1, None, (None,))], None),
        ([Reached(0, ResumeVerdict.FRESH, (23,))], 23),
        ([Reached(1, ResumeVerdict.REFUSED, ())], None),  # attempt 0 missing (an attached console)
    ],
)
def test_the_step_the_earlier_attempts_reached(earlier: list[Reached], want: int | None) -> None:
    number = earlier[-1].attempt + 1 if earlier else 0
    assert frontier(number, earlier) == want
    assert frontier(number + 1, earlier) is None  # the attempt right before it must be known


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


def run(second: list[Event], *more: list[Event]) -> ClusterState:
    """Attempt 0 steps to 160 and fails; attempt 1 plays ``second`` (then each of ``more``, the
    last one succeeds)."""
    first = [metric(0, "r0", 1), metric(0, "r1", 1), metric(0, "r0", 160), metric(0, "r1", 160)]
    state = ClusterState()
    later = [second, *more]
    evs = [
        RunStarted(0, "run", "inv.yaml", ("a", "b"), 2, "/logs", max_restarts=len(later)),
        *attempt(0, first, AttemptOutcome.FAILED),
    ]
    for n, body in enumerate(later, 1):
        evs += attempt(n, body, AttemptOutcome.SUCCEEDED if n == len(later) else AttemptOutcome.FAILED)
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
    # attempt 0's ranks reported step 160: 151..160 are computed again
    assert "\nattempt 1: every rank resumed at step 150 (snapshot); 10 steps computed again\n" in text
    assert "attempt 0:" not in text  # the first attempt starts at the beginning: no line
    doc = json.loads(json.dumps(summary(state).to_json()))
    r1 = doc["attempts"][1]["resume"]
    assert r1["verdict"] == "resumed" and r1["step"] == 150 and r1["recomputed"] == 10
    assert r1["ranks"][1] == {
        "name": "r1",
        "node": "b",  # the attempt's, not the message's
        "rank": 1,
        "source": "snapshot",
        "step": 150,
        "epoch": 3,
        "first_step": 151,
        "first_epoch": None,
        "reason": None,
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


def refusal(n: int, name: str, reason: str | None = REASON) -> AgentEvent:
    return agent(n, P.RankResumed("a", name, int(name[1:]), 0, P.ResumeSource.REFUSED, None, 1, reason))


def test_a_refused_restart_in_the_state_the_summary_and_the_json() -> None:
    second = [refusal(1, "r0"), refusal(1, "r1", "rank 0 refuses (its log says why)")]
    state = run(second)
    a1 = state.attempt_summaries()[1].resume
    assert a1 is not None and (a1.verdict, a1.step, a1.recomputed) == (ResumeVerdict.REFUSED, None, None)
    assert [(s.name, s.source, s.step, s.reason) for s in a1.ranks] == [
        ("r0", StartSource.REFUSED, None, REASON),
        ("r1", StartSource.REFUSED, None, "rank 0 refuses (its log says why)"),
    ]
    text = format_summary(summary(state))
    want = (
        f"rank r0 and 1 other rank refused to resume: {REASON} (the relaunch stopped before its first step)"
    )
    assert f"\nattempt 1: {want}\n" in text
    doc = json.loads(json.dumps(summary(state).to_json()))
    r1 = doc["attempts"][1]["resume"]
    assert (r1["verdict"], r1["step"], r1["recomputed"]) == ("refused", None, None)
    assert [(x["source"], x["reason"]) for x in r1["ranks"]] == [
        ("refused", REASON),
        ("refused", "rank 0 refuses (its log says why)"),
    ]
    assert result_from_json(doc) == summary(state)  # reads back whole
    said = second[0]
    assert from_json(json.loads(json.dumps(to_json(said)))) == said  # a recording replays the message


def test_a_refusals_reason_is_shown_escaped() -> None:
    state = run([refusal(1, "r0", "bad \x1b]0;title\x07 state"), refusal(1, "r1")])
    text = format_summary(summary(state))
    assert "\x1b" not in text and "\x07" not in text
    assert "rank r0 and 1 other rank refused to resume: bad \\x1b]0;title\\x07 state (" in text


def test_steps_computed_again_count_from_the_attempt_that_stepped() -> None:
    # Attempt 0 reached 160; attempt 1 refused before any step; attempt 2 resumed at 150.
    third = [agent(2, resumed("r0", 150)), agent(2, resumed("r1", 150)), metric(2, "r0", 151)]
    state = run([refusal(1, "r0"), refusal(1, "r1")], third)
    a1, a2 = (a.resume for a in state.attempt_summaries()[1:])
    assert a1 is not None and a1.verdict is ResumeVerdict.REFUSED
    assert a2 is not None and (a2.verdict, a2.step, a2.recomputed) == (ResumeVerdict.RESUMED, 150, 10)
    assert (
        "\nattempt 2: every rank resumed at step 150 (snapshot); 10 steps computed again\n"
        in format_summary(summary(state))
    )
    # An attempt after a resumed one counts from the resumed one's reports (151), not attempt 0's.
    fourth = [agent(3, resumed("r0", 151)), agent(3, resumed("r1", 151))]
    again = run([refusal(1, "r0"), refusal(1, "r1")], third, fourth).attempt_summaries()[3].resume
    assert again is not None and (again.step, again.recomputed) == (151, 0)
    assert describe_resume(again) == "every rank resumed at step 151 (snapshot); none computed again"


def test_the_current_attempt_counts_steps_computed_again_as_it_goes() -> None:
    state = ClusterState()
    for ev in [
        RunStarted(0, "run", "inv.yaml", ("a", "b"), 2, "/logs", max_restarts=1),
        *attempt(0, [metric(0, "r0", 22), metric(0, "r1", 23)], AttemptOutcome.FAILED),
        AttemptStarted(1, REFS, "10.0.0.1", 8118, 3),
        agent(1, resumed("r0", 21)),
        agent(1, resumed("r1", 21)),
    ]:
        state.apply(ev)
    now = state.resume()
    assert now is not None and (now.verdict, now.recomputed) == (ResumeVerdict.RESUMED, 2)
    assert describe_resume(now) == "every rank resumed at step 21 (snapshot); 2 steps computed again"
