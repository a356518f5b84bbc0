"""Replica consistency: data-parallel ranks report a parameter digest every N steps; all must agree."""

from __future__ import annotations

from collections import Counter

from mscon.console.engine.events import ReplicaDivergence

_WINDOW = 200  # steps kept while waiting for the slowest rank's report


class ReplicaWatch:
    def __init__(self, world_size: int, attempt: int = 0) -> None:
        self.world_size = world_size
        self.attempt = attempt
        self.by_step: dict[int, dict[str, str]] = {}
        self.flagged: set[str] = set()

    def observe(self, rank: str, step: int, checksum: str) -> ReplicaDivergence | None:
        seen = self.by_step.setdefault(step, {})
        seen[rank] = checksum
        for old in [s for s in self.by_step if s < step - _WINDOW]:
            del self.by_step[old]  # a rank that died never completes these
        if len(seen) < self.world_size:
            return None
        del self.by_step[step]
        (majority, votes), *_ = Counter(seen.values()).most_common(1)
        if votes * 2 <= len(seen):  # no strict majority: every rank is suspect
            odd = tuple(sorted(seen))
        else:
            odd = tuple(sorted(r for r, c in seen.items() if c != majority))
        fresh = tuple(r for r in odd if r not in self.flagged)
        if not fresh:
            return None
        self.flagged.update(fresh)
        return ReplicaDivergence(attempt=self.attempt, step=step, ranks=fresh, majority=majority)
