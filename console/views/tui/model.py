"""What the views read: the source's ClusterState plus the feed's derived views, and the filter."""

from __future__ import annotations

from mscon.console.engine.events import RankState
from mscon.console.engine.state import ClusterState
from mscon.console.engine.state_views import RankView
from mscon.console.views.tui.feed import Feed
from mscon.console.views.tui.filtering import RankFilter
from mscon.console.views.tui.fmt import FAILED, LIVE
from mscon.console.views.tui.linestore import LineStore
from mscon.console.views.tui.source import Source

PANE_LIMIT = 16  # above this many ranks the Devices screen shows one table row per rank


class ViewModel:
    def __init__(self, source: Source, feed: Feed, store: LineStore, pane_limit: int = PANE_LIMIT) -> None:
        self.source = source
        self.feed = feed
        self.store = store
        self.pane_limit = pane_limit
        self.query = ""
        self._filter = RankFilter("")
        self._roles: dict[str, str] | None = None
        self._workers: list[RankView] = []
        self._workers_of: dict[str, RankView] | None = None
        self._workers_n = -1

    @property
    def state(self) -> ClusterState:
        return self.source.state

    def set_query(self, query: str) -> None:
        self.query = query.strip()
        self._filter = RankFilter(self.query)

    def selected(self, r: RankView) -> bool:
        return self._filter(r, r.name in self.feed.stragglers)

    def select(self, ranks: list[RankView]) -> list[RankView]:
        """The ranks the filter selects, in their order (``selected`` for each, in bulk)."""
        if not self.query:
            return list(ranks)
        return self._filter.select(ranks, self.feed.stragglers, self.state.nodes)

    def workers(self) -> list[RankView]:
        """The workers by rank; the same list object until the set of ranks changes (a new
        attempt replaces ``state.ranks``), so callers can tell "unchanged" by identity and the
        8,000-rank sort runs once per attempt, not once per frame. Read-only for callers."""
        ranks = self.state.ranks
        if ranks is not self._workers_of or len(ranks) != self._workers_n:
            self._workers = sorted(self.state.workers(), key=lambda r: r.rank)
            self._workers_of, self._workers_n = ranks, len(ranks)
        return self._workers

    def visible_workers(self) -> list[RankView]:
        return self.select(self.workers())

    def rank_counts(self) -> tuple[int, int, int]:
        """Workers up (live), failed or hung or lost, and in all: from the state's counts by state,
        not a scan (every frame asks, at 80,000 ranks)."""
        states = self.state.worker_states()
        up = sum(n for s, n in states.items() if s in LIVE)
        failed = sum(n for s, n in states.items() if s in FAILED)
        return up, failed, sum(states.values())

    def straggler(self, r: RankView) -> bool:
        return r.name in self.feed.stragglers and r.state is RankState.RUNNING

    def invalidate_roles(self) -> None:
        self._roles = None

    def role(self, name: str) -> str:
        """ "root cause", "victim" or "", as the state's own summary says (no policy here)."""
        if self._roles is None:
            att = self.state.attempt
            has_root = att is not None and self.state.root_cause(att) is not None
            self._roles = {s.name: s.role for s in self.state.rank_summaries()} if has_root else {}
        return self._roles.get(name, "")

    def elapsed_s(self) -> float:
        atts = self.state.attempts
        if not atts or not atts[0].started_ns:
            return 0.0
        end = self.state.result and atts[-1].ended_ns
        now = end or self.source.now_ns()
        return max(0.0, (now - atts[0].started_ns) / 1e9)

    def restarts_used(self) -> int:
        return max(0, len(self.state.attempts) - 1)
