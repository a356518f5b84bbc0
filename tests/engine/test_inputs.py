"""The supervisor's input queue (console/engine/inputs.py): what jumps it, and in what order."""

from __future__ import annotations

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
