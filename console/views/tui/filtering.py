"""The rank filter (``/`` on the cluster screens): which ranks a query selects.

Words are and-ed, case-insensitive. ``node:NAME`` and ``state:STATE`` match those fields
(``state:straggler`` selects stragglers); ``rN`` or a plain word matches the rank's name, node,
state or last log line. An empty query selects every rank.
"""

from __future__ import annotations

from collections.abc import Callable

from mscon.console.engine.state_views import RankView
from mscon.console.views.log_lines import last_meaningful

RankTest = Callable[[RankView, bool], bool]


def rank_filter(query: str) -> RankTest:
    words = [w.lower() for w in query.split()]
    if not words:
        return lambda r, straggler: True

    def test(r: RankView, straggler: bool) -> bool:
        state = r.state.value
        last = last_meaningful(r.tail).lower()
        for w in words:
            if w.startswith("node:"):
                if w[5:] not in r.node.lower():
                    return False
            elif w.startswith("state:"):
                want = w[6:]
                if want == "straggler":
                    if not straggler:
                        return False
                elif not state.startswith(want):
                    return False
            elif w == "straggler":
                if not straggler:
                    return False
            elif not (w == r.name.lower() or w in r.node.lower() or w in state or w in last):
                return False
        return True

    return test
