"""The start-up panel shows where the attempt's start-up time went, until every worker's first step."""

from __future__ import annotations

from mscon.agent.protocol import Milestone, ProcStarted, RankPhase
from mscon.console.engine.events import (
    AgentEvent,
    AttemptStarted,
    ChecksFinished,
    Event,
    NodeState,
    NodeUpdate,
    RankRef,
    RunStarted,
)
from mscon.console.engine.state import ClusterState
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.source import ReplaySource
from mscon.console.views.tui.startup import breakdown, starting
from tui_helpers import SIZE, screen_text, settled

T0 = 1_700_000_000 * 10**9
REFS = (RankRef("sched", "local", -1), RankRef("r0", "local", 0), RankRef("r1", "local", 1))


def _ns(s: float) -> int:
    return T0 + round(s * 1e9)


def _events(through: str) -> list[Event]:
    """A launch on one node, both workers' milestones up to ``through`` (r1's last one left out)."""
    evs: list[Event] = [
        RunStarted(0, "run-phases", "inv.yaml", ("local",), 2, "/logs"),
        NodeUpdate(0, "local", NodeState.CONNECTING, "", _ns(0)),
        NodeUpdate(0, "local", NodeState.DEPLOYING, "", _ns(0.25)),
        NodeUpdate(0, "local", NodeState.READY, "", _ns(0.5)),
        ChecksFinished(0, ts_ns=_ns(1.0)),
        AttemptStarted(0, REFS, "127.0.0.1", 8118, _ns(1.5)),
    ]
    evs += [AgentEvent(0, ProcStarted("local", r.name, r.rank, 10, _ns(1.6), "/l")) for r in REFS]
    order = [Milestone.IMPORTED, Milestone.JOINED, Milestone.READY, Milestone.COMPILED, Milestone.FIRST_STEP]
    for i, m in enumerate(order[: order.index(through) + 1]):
        for r in REFS[1:]:
            evs.append(AgentEvent(0, RankPhase("local", r.name, r.rank, m, _ns(2 + i + r.rank / 10))))
    return evs[:-1]


def test_the_panel_stays_until_every_worker_has_stepped() -> None:
    state = ClusterState()
    for ev in _events(Milestone.FIRST_STEP):
        state.apply(ev)
    assert starting(state)  # r1 has not stepped yet
    text = breakdown(state)
    assert text is not None and text.startswith("from the launch: connected +0.25 s")
    assert "MindSpore imported" in text and "first step" not in text  # the last worker counts
    state.apply(AgentEvent(0, RankPhase("local", "r1", 1, Milestone.FIRST_STEP, _ns(6.1))))
    assert not starting(state)
    assert (breakdown(state) or "").endswith("first step +1.00 s; 6.10 s to first step")


async def test_the_start_up_panel_shows_the_breakdown() -> None:
    app = MsconApp(ReplaySource(_events(Milestone.COMPILED), speed=0), toasts=False)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = screen_text(app)
    assert "start-up from the launch: connected +0.25 s, agents up +0.25 s" in text
    assert "cluster joined" in text
