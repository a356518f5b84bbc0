"""Where a restart's ranks started, through the supervisor with in-process fake agents
(tests/engine/fake_agent.py): ranks that send their resume record are said to resume at its step,
ranks that step without one to start over, a rank that refuses to have refused (and the attempt),
and a resumed attempt counts the steps it computes again; the run's result, its JSON and the
headless summary say so. Layout: node ``a`` runs the scheduler, r0 and r1; node ``b`` r2 and r3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_agent import Exit, Log, Met, Resumed, Script
from mscon.agent import policy as policy_mod
from mscon.console.engine import supervisor as supervisor_mod
from mscon.console.engine.events import AttemptOutcome, JobState, ResumeVerdict, StartSource
from mscon.console.engine.resume import FIX
from mscon.console.views.headless.reporter import format_summary
from test_supervisor_policy import make_cluster, run_job

WORKERS = ("r0", "r1", "r2", "r3")


@pytest.fixture(autouse=True)
def _fast_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_mod, "SCHEDULER_LINGER_S", 0.2)
    monkeypatch.setattr(supervisor_mod, "_TICK_S", 0.05)


def killed_then(second: dict[str, list]) -> object:
    """Attempt 0: every rank steps 1..3, r1 is killed at 0.1 s; attempt 1 plays ``second`` and every
    worker (then the scheduler) exits 0."""

    def script(attempt: int) -> Script:
        if attempt == 0:
            out: dict[str, list] = {n: [Met(0.02, 1), Met(0.04, 2), Met(0.06, 3)] for n in WORKERS}
            out["r1"] = [*out["r1"], Exit(0.1, signal="SIGKILL")]
            return out
        out = {n: [*second.get(n, []), Log(0.08, (f"{n} done",)), Exit(0.1)] for n in WORKERS}
        out["sched"] = [Exit(0.15)]
        return out

    return script


async def test_a_restart_that_resumed_from_its_snapshot(tmp_path: Path) -> None:
    second = {n: [Resumed(0.02, 150, "snapshot", epoch=3), Met(0.04, 151), Met(0.06, 152)] for n in WORKERS}
    run = await run_job(tmp_path, make_cluster(tmp_path, killed_then(second)), max_restarts=1)  # type: ignore[arg-type]
    r = run.result
    assert r.status is JobState.SUCCEEDED, r.reason
    assert [a.outcome for a in r.attempts] == [AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED]
    res = r.attempts[1].resume
    assert res is not None and (res.verdict, res.step) == (ResumeVerdict.RESUMED, 150)
    assert [(s.name, s.node, s.source, s.step, s.epoch, s.first_step) for s in res.ranks] == [
        ("r0", "a", StartSource.SNAPSHOT, 150, 3, 151),
        ("r1", "a", StartSource.SNAPSHOT, 150, 3, 151),
        ("r2", "b", StartSource.SNAPSHOT, 150, 3, 151),
        ("r3", "b", StartSource.SNAPSHOT, 150, 3, 151),
    ]
    text = format_summary(r)
    assert "\nattempt 1: every rank resumed at step 150 (snapshot)\n" in text, text
    assert "started over" not in text
    doc = json.loads(json.dumps(r.to_json()))
    assert [(x["name"], x["source"], x["step"]) for x in doc["attempts"][1]["resume"]["ranks"]] == [
        (n, "snapshot", 150) for n in WORKERS
    ]


async def test_a_restart_of_a_script_that_does_not_resume_started_over(tmp_path: Path) -> None:
    second = {n: [Met(0.04, 1), Met(0.06, 2)] for n in WORKERS}  # no record: back at step 1
    run = await run_job(tmp_path, make_cluster(tmp_path, killed_then(second)), max_restarts=1)  # type: ignore[arg-type]
    r = run.result
    assert r.status is JobState.SUCCEEDED, r.reason
    res = r.attempts[1].resume
    assert res is not None and res.verdict is ResumeVerdict.STARTED_OVER
    assert {s.source for s in res.ranks} == {StartSource.STARTED_OVER}
    assert f"\nattempt 1: the script started over: it does not resume ({FIX})\n" in format_summary(r)
    assert json.loads(json.dumps(r.to_json()))["attempts"][1]["resume"]["verdict"] == "started over"


async def test_a_restart_says_how_many_steps_it_computes_again(tmp_path: Path) -> None:
    # Attempt 0's ranks reported step 3; attempt 1 resumes after step 1: steps 2 and 3 run again.
    second = {n: [Resumed(0.02, 1, "snapshot"), Met(0.04, 2), Met(0.06, 3)] for n in WORKERS}
    run = await run_job(tmp_path, make_cluster(tmp_path, killed_then(second)), max_restarts=1)  # type: ignore[arg-type]
    r = run.result
    assert r.status is JobState.SUCCEEDED, r.reason
    res = r.attempts[1].resume
    assert res is not None and (res.verdict, res.step, res.recomputed) == (ResumeVerdict.RESUMED, 1, 2)
    assert "\nattempt 1: every rank resumed at step 1 (snapshot); 2 steps computed again\n" in format_summary(
        r
    )
    assert json.loads(json.dumps(r.to_json()))["attempts"][1]["resume"]["recomputed"] == 2


REASON = 'keep holds two objects with the parameter beta1_power: pass them as keep={"g": opt_g, "d": opt_d}'


async def test_a_restart_a_rank_refused_to_resume_stops_before_its_first_step(tmp_path: Path) -> None:
    """Attempt 0 steps 1..3 and r1 is killed; in attempt 1 every worker writes a refusal (r0 its own
    reason, the others that r0 refuses, as mscon_resume does) and exits 65 before any step."""

    def script(attempt: int) -> Script:
        if attempt == 0:
            out: Script = {n: [Met(0.02, 1), Met(0.04, 2), Met(0.06, 3)] for n in WORKERS}
            out["r1"] = [*out["r1"], Exit(0.1, signal="SIGKILL")]
            return out
        why = {n: REASON if n == "r0" else "rank 0 refuses (its log says why)" for n in WORKERS}
        return {n: [Resumed(0.02, 0, "refused", reason=why[n]), Exit(0.05, code=65)] for n in WORKERS}

    run = await run_job(tmp_path, make_cluster(tmp_path, script), max_restarts=1)
    r = run.result
    assert r.status is JobState.FAILED, r.reason
    res = r.attempts[1].resume
    assert res is not None and (res.verdict, res.step, res.recomputed) == (ResumeVerdict.REFUSED, None, None)
    assert [(s.name, s.source, s.step, s.first_step) for s in res.ranks] == [
        (n, StartSource.REFUSED, None, None) for n in WORKERS
    ]
    text = format_summary(r)
    want = (
        f"rank r0 and 3 other ranks refused to resume: {REASON} (the relaunch stopped before its first step)"
    )
    assert f"\nattempt 1: {want}\n" in text, text
    doc = json.loads(json.dumps(r.to_json()))["attempts"][1]["resume"]
    assert doc["verdict"] == "refused" and doc["ranks"][0]["reason"] == REASON
