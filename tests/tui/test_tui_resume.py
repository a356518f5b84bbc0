"""The Overview says where a restart's ranks started: a script that does not resume is said to have
started over, with its one-line fix; a resumed restart, at which step."""

from __future__ import annotations

from mscon.agent.protocol import Metric, ProcExited, ProcStarted, RankResumed
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptStarted,
    Event,
    NodeState,
    NodeUpdate,
    RankRef,
    Restarting,
    RunStarted,
)
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.source import ReplaySource
from tui_helpers import SIZE, screen_text, settled

REFS = (RankRef("sched", "local", -1), RankRef("r0", "local", 0), RankRef("r1", "local", 1))


def _restart(second: list[Event]) -> list[Event]:
    """Attempt 0 steps to 3 and r1 is killed; attempt 1 plays ``second`` (and stays running)."""
    evs: list[Event] = [
        RunStarted(0, "run-resume", "inv.yaml", ("local",), 2, "/logs", max_restarts=1),
        NodeUpdate(0, "local", NodeState.READY, "", 1),
    ]
    for n in (0, 1):
        evs.append(AttemptStarted(n, REFS, "127.0.0.1", 8118, 10 + n))
        evs += [AgentEvent(n, ProcStarted("local", r.name, r.rank, 10 + n, 10 + n, "/l")) for r in REFS]
        if n == 0:
            evs += [AgentEvent(0, Metric("local", f"r{i}", i, s, 0.5)) for s in (1, 2, 3) for i in (0, 1)]
            evs.append(AgentEvent(0, ProcExited("local", "r1", 1, 10, None, "SIGKILL", 9, 12, False)))
            evs.append(AttemptEnded(0, AttemptOutcome.FAILED, "r1 killed by SIGKILL", None, 13))
            evs.append(Restarting(1, "r1 failed", 0.0, 0))
    return evs + second


async def test_the_overview_says_a_script_that_does_not_resume_started_over() -> None:
    second: list[Event] = [AgentEvent(1, Metric("local", f"r{i}", i, 1, 0.5)) for i in (0, 1)]
    app = MsconApp(ReplaySource(_restart(second), speed=0), toasts=False)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = screen_text(app)
    flat = " ".join(text.split())
    assert (
        "attempt 1: the script started over: it does not resume (one line fixes it: wrap the loop in" in flat
    )
    assert 'mscon_resume, see docs/usage.md "Resume your own script")' in flat


async def test_the_overview_says_a_restart_resumed_at_its_step() -> None:
    second: list[Event] = [
        AgentEvent(1, RankResumed("local", f"r{i}", i, 150, "snapshot", 3, 11)) for i in (0, 1)
    ]
    second += [AgentEvent(1, Metric("local", f"r{i}", i, 151, 0.5)) for i in (0, 1)]
    app = MsconApp(ReplaySource(_restart(second), speed=0), toasts=False)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = screen_text(app)
    assert "attempt 1: every rank resumed at step 150 (snapshot)" in text
    assert "started over" not in text


async def test_the_overview_says_a_rank_refused_and_the_steps_computed_again() -> None:
    why = "keep holds two objects with the parameter beta1_power"
    second: list[Event] = [
        AgentEvent(1, RankResumed("local", f"r{i}", i, 0, "refused", None, 11, f"{why}\x1b[2J"))
        for i in (0, 1)
    ]
    app = MsconApp(ReplaySource(_restart(second), speed=0), toasts=False)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = screen_text(app)
    flat = " ".join(text.split())
    assert f"attempt 1: rank r0 and 1 other rank refused to resume: {why}\\x1b[2J (the relaunch" in flat
    # Attempt 0 reached step 3: resumed after step 1, two steps run again.
    second = [AgentEvent(1, RankResumed("local", f"r{i}", i, 1, "snapshot", 0, 11)) for i in (0, 1)]
    app = MsconApp(ReplaySource(_restart(second), speed=0), toasts=False)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = screen_text(app)
    assert "attempt 1: every rank resumed at step 1 (snapshot); 2 steps computed again" in text
