"""Alarms first on the bus (issue 44): a sink far behind sees a failure, a lost node and the
console's Stopping ahead of the agents' output queued before them, never ahead of another lifecycle
event; a sink that keeps up sees everything in the order it happened."""

from __future__ import annotations

import asyncio

from mscon.agent import protocol as P
from mscon.console.engine.bus import JUMP_PAST, EventBus
from mscon.console.engine.events import AgentEvent, Event, NodeState, NodeUpdate, Notice, Stopping

FAILED = AgentEvent(0, P.ProcExited("a", "r1", 1, 99, 6, None, None, 3, stopped_by_agent=False))
LOST = NodeUpdate(0, "b", NodeState.LOST, "connection closed")
STOPPING = Stopping(0, "r1 on a failed (exit code 6)", "r1")
NOTE = Notice(0, "a lifecycle event")


def _log(i: int) -> AgentEvent:
    return AgentEvent(0, P.LogBatch("a", "r0", 0, i, (f"line {i}",), i))


async def _taken(bus: EventBus, events: list[Event]) -> list[Event]:
    """What a sink that was not scheduled while ``events`` were published sees, in order."""
    seen: list[Event] = []
    bus.add_sink("view", seen.append)
    for ev in events:
        bus.publish(ev)
    await bus.close()
    return seen


def test_a_failure_goes_ahead_of_a_backlog_of_output_but_not_of_what_happened_before_it() -> None:
    backlog = [_log(i) for i in range(JUMP_PAST + 50)]
    events: list[Event] = [*backlog[:10], NOTE, *backlog[10:], FAILED, LOST, _log(10_000), STOPPING]
    seen = asyncio.run(_taken(EventBus(), events))
    assert seen[:11] == [*backlog[:10], NOTE]  # the lifecycle event before the alarms stays first
    assert seen[11:14] == [FAILED, LOST, STOPPING]
    assert seen[14:] == [*backlog[10:], _log(10_000)]  # the output, in order, after them


def test_a_sink_that_keeps_up_sees_the_order_as_it_happened() -> None:
    events: list[Event] = [*(_log(i) for i in range(JUMP_PAST - 2)), FAILED, _log(999), STOPPING]
    assert asyncio.run(_taken(EventBus(), events)) == events
