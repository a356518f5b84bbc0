"""Which ranks' log lines the console's views want, and the Subscribe each agent gets (issue 44).

The console pays per node and per tick, not per line: an agent sends the lines of the ranks some
view shows (a TUI pane in sight, ``mscon run --no-tui``'s chosen ranks) and, every tick, one
NodeSummary of its ranks' latest metrics and counts. Every line stays on its node and is fetched
at the end. A view says what it wants under its own name; the agents get the union.
"""

from __future__ import annotations

from collections.abc import Iterable

from mscon.agent.protocol import Subscribe

# The summary tick grows with the run so the console takes at most about this many NodeSummary
# messages a second, whatever the node count (1 s up to 1,000 nodes, 10 s at 10,000).
SUMMARIES_PER_S = 1000.0
MIN_TICK_S = 1.0
MAX_TICK_S = 10.0

# Up to this many ranks every metric still reaches the console (Subscribe.every_metric): the
# straggler watch compares ranks step by step, and 1,024 ranks at a few steps a second are cheap.
# Beyond, each rank's latest metric comes once a summary tick.
EVERY_METRIC_UP_TO = 1024

# The default of --no-tui and the TUI: every rank's lines up to this many ranks, rank 0's beyond (see
# docs/usage.md: "What --no-tui prints").
ALL_RANKS_UP_TO = 64


def summary_tick_s(nodes: int) -> float:
    """The NodeSummary interval for a run of ``nodes`` nodes."""
    return min(MAX_TICK_S, max(MIN_TICK_S, nodes / SUMMARIES_PER_S))


def default_lines(world_size: int) -> frozenset[int] | None:
    """What a view shows by default (--no-tui without --lines, the TUI before a pane opens): every
    rank's lines (None) in a small run, rank 0's in a large one."""
    return None if world_size <= ALL_RANKS_UP_TO else frozenset({0})


# A console that falls behind (starved of CPU beside other jobs) slows the summaries down, up to
# this, rather than letting a backlog grow; it speeds them up again once it has caught up.
SLOWEST_TICK_S = 30.0


class SummaryPace:
    """The summary tick: ``summary_tick_s`` of the run's size, doubled while the console's queue
    of agent messages stays past ``behind`` (at most once a tick), halved back towards it once the
    queue is under ``caught_up`` for three ticks. Never past ``slowest`` (a third of the hang
    timeout: a rank's progress reaches the console with the summaries)."""

    def __init__(
        self, nodes: int, behind: int, caught_up: int = 100, slowest: float = SLOWEST_TICK_S
    ) -> None:
        self.slowest = min(SLOWEST_TICK_S, slowest)
        self.base = min(summary_tick_s(nodes), self.slowest)
        self.tick_s = self.base
        self.behind = behind
        self.caught_up = caught_up
        self._changed = float("-inf")

    def observe(self, queued: int, now: float) -> bool:
        """The queue's length now; True when the tick changed (the agents are to be told)."""
        if queued >= self.behind and self.tick_s < self.slowest and now - self._changed >= self.tick_s:
            self.tick_s = min(self.slowest, self.tick_s * 2)
        elif queued < self.caught_up and self.tick_s > self.base and now - self._changed >= 3 * self.tick_s:
            self.tick_s = max(self.base, self.tick_s / 2)
        else:
            return False
        self._changed = now
        return True


class RanksSpecError(ValueError):
    """A --lines value that names no ranks the way it should."""


def parse_ranks(text: str) -> frozenset[int] | None:
    """``all`` (None: every rank), ``none`` (no rank), or ranks and ranges: ``0,3,8-15``."""
    text = text.strip()
    if text == "all":
        return None
    if text == "none":
        return frozenset()
    ranks: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise RanksSpecError(f"{part.strip()!r} is not a rank or a range (e.g. 0,3,8-15; all; none)")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise RanksSpecError(f"{part.strip()!r}: the range ends before it starts")
        if last - first > 1_000_000:
            raise RanksSpecError(f"{part.strip()!r}: a range of more than a million ranks")
        ranks.update(range(first, last + 1))
    return frozenset(ranks)


class LinesWanted:
    """Each view's wish (a set of global ranks, or None for all of them); the agents get the union.

    Until a view says anything, nothing is subscribed and the agents stream as before version 9
    (every line, every metric): a console built without views (a test, an embedding) sees all."""

    def __init__(self) -> None:
        self._views: dict[str, frozenset[int] | None] = {}

    @property
    def any(self) -> bool:
        """Whether some view has said what it wants (then the agents are subscribed)."""
        return bool(self._views)

    def want(self, view: str, ranks: Iterable[int] | None) -> bool:
        """Set ``view``'s wish (None: every rank); True when the union changed."""
        before = self.union() if self._views else ()
        self._views[view] = None if ranks is None else frozenset(ranks)
        return before != self.union()

    def drop(self, view: str) -> bool:
        """Forget ``view``'s wish; True when the union changed."""
        if view not in self._views:
            return False
        before = self.union()
        del self._views[view]
        return not self._views or before != self.union()

    def union(self) -> frozenset[int] | None:
        out: set[int] = set()
        for ranks in self._views.values():
            if ranks is None:
                return None
            out |= ranks
        return frozenset(out)

    def subscription(self, node_ranks: Iterable[int], tick_s: float, every_metric: bool = False) -> Subscribe:
        """What one node's agent is told: the wanted ranks among its own (``node_ranks``)."""
        union = self.union()
        if union is None:
            return Subscribe(all_ranks=True, tick_s=tick_s, every_metric=every_metric)
        ranks = tuple(sorted(r for r in node_ranks if r in union))
        return Subscribe(ranks=ranks, tick_s=tick_s, every_metric=every_metric)
