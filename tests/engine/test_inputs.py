"""The supervisor's input queue (console/engine/inputs.py): what jumps it, and in what order."""

from __future__ import annotations

import asyncio

from mscon.agent.protocol import Evidence, LogBatch, ProcExited
from mscon.console.engine.commands import StopJob
from mscon.console.engine.inputs import TICK, Alarm, Inputs

LOG = LogBatch("a", "r0", 0, 0, ("step 1",), 1)
BLAME = Evidence("a", "sched", -1, (1,), "first_timed_out", "The node 1 is the first one timed out", 2)
FAILED = ProcExited("a", "r1", 1, 99, 6, None, None, 3, stopped_by_agent=False)
STOPPED = ProcExited("a", "r0", 0, 98, None, "SIGTERM", 15, 4, stopped_by_agent=True)


def _drain(q: Inputs) -> list[object]:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def test_a_failure_jumps_the_log_batches_and_still_follows_in_order() -> None:
    q = Inputs()
    for msg in (LOG, FAILED, STOPPED):
        q.put_nowait(("a", msg))
    assert _drain(q) == [Alarm("a", FAILED), ("a", LOG), ("a", FAILED), ("a", STOPPED)]


def test_the_schedulers_blame_sent_before_a_failure_is_taken_before_the_failures_alarm() -> None:
    """An agent sends a process's last lines before its exit: the blame line that came before a
    rank's failure must reach the state before the stop it sets off, or it is dropped as said while
    stopping and the verdict names the wrong rank."""
    q = Inputs()
    for msg in (LOG, BLAME, FAILED):
        q.put_nowait(("a", msg))
    assert _drain(q) == [("a", BLAME), Alarm("a", FAILED), ("a", LOG), ("a", FAILED)]


def test_commands_come_first_then_ticks_then_agents() -> None:
    q = Inputs()
    q.put_nowait(("a", LOG))
    q.put_nowait(TICK)
    stop = StopJob("operator", 130)
    q.put_nowait(stop)
    assert _drain(q) == [stop, TICK, ("a", LOG)]


def test_agent_messages_past_the_backlog_wait() -> None:
    """Issue 44: the console's memory does not grow with a backlog. A reader whose message would
    go past ``backlog`` waits (its channel backs up; the agent keeps the lines in their files)."""

    async def main() -> None:
        q = Inputs(backlog=3)
        for _ in range(3):
            await q.put(("a", LOG))
        blocked = asyncio.ensure_future(q.put(("a", STOPPED)))
        await asyncio.sleep(0)  # one turn of the loop: it had its chance to go in
        assert not blocked.done()
        assert q.get_nowait() == ("a", LOG)
        await asyncio.sleep(0)
        assert not blocked.done()  # the room opens at half the bound, not at every message taken
        assert q.get_nowait() == ("a", LOG)
        await asyncio.wait_for(blocked, 5)
        assert _drain(q) == [("a", LOG), ("a", STOPPED)]

    asyncio.run(main())


def test_past_the_backlog_samples_are_dropped_and_an_alarm_goes_in_at_once() -> None:
    from mscon.agent.protocol import NodeSummary, RankCount

    async def main() -> None:
        q = Inputs(backlog=2)
        for _ in range(2):
            await q.put(("a", LOG))
        summary = NodeSummary("a", 1.0, (RankCount("r0", 0, 5, 1),))
        await asyncio.wait_for(q.put(("a", summary)), 5)  # not waiting: dropped, the next supersedes
        assert q.dropped == 1
        await asyncio.wait_for(q.put(("a", FAILED)), 5)  # not waiting either: an alarm
        assert _drain(q) == [Alarm("a", FAILED), ("a", LOG), ("a", LOG), ("a", FAILED)]

    asyncio.run(main())


def test_a_failure_read_behind_a_backlog_goes_in_before_the_reader_waits() -> None:
    """Issue 44: a reader that found [batches..., exit] buffered together hands the exit's alarm
    (and blame read with it) on at once, though the queue is full and the batches wait for room."""

    async def main() -> None:
        q = Inputs(backlog=2)
        for _ in range(2):
            await q.put(("a", LOG))
        reader = asyncio.ensure_future(q.put_all("a", [LOG, LOG, BLAME, FAILED]))
        await asyncio.sleep(0)
        assert not reader.done()  # its batches wait for room
        assert q.get_nowait() == ("a", BLAME)
        assert q.get_nowait() == Alarm("a", FAILED)
        while not reader.done():
            assert q.get_nowait() == ("a", LOG)
            await asyncio.sleep(0)
        rest = _drain(q)
        assert rest.count(("a", LOG)) + 2 == 4 and rest[-1] == ("a", FAILED)  # the exit after them
        assert ("a", BLAME) not in rest  # taken once

    asyncio.run(main())


def test_messages_read_together_keep_their_order_but_for_what_jumps() -> None:
    """An exit the agent caused (a Stop's) jumps nothing; blame read with it goes first, once."""

    async def main() -> None:
        q = Inputs()
        await q.put_all("a", [LOG, STOPPED, BLAME, LOG])
        assert _drain(q) == [("a", BLAME), ("a", LOG), ("a", STOPPED), ("a", LOG)]

    asyncio.run(main())
