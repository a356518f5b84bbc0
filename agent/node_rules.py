"""The rules an agent applies on its own node, before (or without) a word from the policy's host:
written once here, next to the run's policy (policy.py), and tested as tables
(tests/agent/test_node_rules.py). The agent (ranks.py, main.py) reads the process states and
the clock and carries out what these say; it decides nothing itself.

- a rank that failed on its own is the node's first failure: its node-local siblings are stopped
  at once, not after a round trip to the policy's host (which then stops the other nodes);
- a rank seen in state T (stopped by a signal) for ``STOPPED_CONFIRM_S`` is reported hung,
  unasked (a debugger's brief attach is not);
- an agent that has not heard from its console for the watchdog period (``policy.watchdog_s``)
  stops its ranks and exits: a partition leaves the channel open on this side. A detached run's
  agents are not watched by a console (followers watch their coordinator: liveness.py).

Pure, stdlib only, Python 3.8, like the policy.
"""

from __future__ import annotations

STATE_CHECK_S = 0.2  # how often process states are read (a SIGSTOPped rank is seen within ~0.5 s)
STOPPED_CONFIRM_S = 0.3  # state T this long is a stop, not a debugger's brief attach
STOPPED_STATES = ("T", "t")  # /proc's "stopped" and "tracing stop"


def stops_siblings(returncode: int | None, stopped_by_agent: bool, node_failed: bool) -> bool:
    """A rank exited: stop its node-local siblings now? Only for the node's first failure of its
    own (an exit code other than 0, not a victim of the agent's own stop)."""
    return returncode is not None and returncode != 0 and not stopped_by_agent and not node_failed


def stopped_state(state: str | None, since: float | None, now: float) -> tuple[float | None, bool]:
    """A rank's process state read at ``now`` (monotonic): (since when it has been stopped, or
    None; True when that has lasted ``STOPPED_CONFIRM_S``: report it hung)."""
    if state not in STOPPED_STATES:
        return None, False
    if since is None:
        return now, False
    return since, now - since >= STOPPED_CONFIRM_S


def console_silent(watchdog_s: float, last_heard: float, now: float, detached: bool) -> bool:
    """No word from the console for the watchdog period (0: not watched): stop the ranks, exit."""
    return not detached and watchdog_s > 0 and now - last_heard > watchdog_s
