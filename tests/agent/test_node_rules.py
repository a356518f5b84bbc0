"""The agent's own rules (agent/node_rules.py), as tables: the sibling stop, the state-T
confirmation and the console-silence watchdog. The agent's I/O around them (ranks.py, main.py)
is exercised by the agent tests that run processes."""

from __future__ import annotations

import pytest
from mscon.agent import node_rules as N
from mscon.agent import ranks


@pytest.mark.parametrize(
    ("returncode", "stopped_by_agent", "node_failed", "stops"),
    [
        (7, False, False, True),  # the node's first failure of its own
        (-9, False, False, True),  # killed by a signal nobody here sent
        (0, False, False, False),  # finished
        (None, False, False, False),  # still running
        (7, True, False, False),  # a victim of the agent's own stop
        (7, False, True, False),  # a sibling failed first: the stop is under way
    ],
)
def test_stops_siblings(
    returncode: int | None, stopped_by_agent: bool, node_failed: bool, stops: bool
) -> None:
    assert N.stops_siblings(returncode, stopped_by_agent, node_failed) is stops


C = N.STOPPED_CONFIRM_S


@pytest.mark.parametrize(
    ("state", "since", "now", "want"),
    [
        ("T", None, 5.0, (5.0, False)),  # first seen stopped: the clock starts
        ("t", None, 5.0, (5.0, False)),  # a tracing stop alike
        ("T", 5.0, 5.0 + C - 0.01, (5.0, False)),  # a debugger's brief attach: not yet
        ("T", 5.0, 5.0 + C + 0.01, (5.0, True)),  # stopped that long: hung
        ("S", 5.0, 9.0, (None, False)),  # running again: forgotten
        ("R", None, 9.0, (None, False)),
        ("", 5.0, 9.0, (None, False)),  # gone, or no /proc
    ],
)
def test_stopped_state(state: str, since: float | None, now: float, want: tuple) -> None:
    assert N.stopped_state(state, since, now) == want


@pytest.mark.parametrize(
    ("watchdog_s", "last_heard", "now", "detached", "silent"),
    [
        (5.0, 0.0, 5.1, False, True),
        (5.0, 0.0, 5.0, False, False),  # at the limit, not past it
        (5.0, 0.0, 50.0, True, False),  # a detached run: no console watches it
        (0.0, 0.0, 50.0, False, False),  # no watchdog in the Start
    ],
)
def test_console_silent(
    watchdog_s: float, last_heard: float, now: float, detached: bool, silent: bool
) -> None:
    assert N.console_silent(watchdog_s, last_heard, now, detached) is silent


def test_the_agent_keeps_no_copy_of_the_rules() -> None:
    """The constants live in node_rules only (ranks.py and main.py had their own)."""
    from mscon.agent import main

    for module in (ranks, main):
        assert not hasattr(module, "_STOPPED_CONFIRM_S") and not hasattr(module, "_STATE_CHECK_S")
