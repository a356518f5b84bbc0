"""The rank filter (``/`` on the cluster screens): which ranks a query selects.

Words are and-ed, case-insensitive. ``node:NAME`` and ``state:STATE`` match those fields
(``state:straggler`` selects stragglers); ``rN`` or a plain word matches the rank's name, node,
state or last log line. An empty query selects every rank.

A query is parsed once into one rule per word, each as cheap as its kind allows: a node's match is
worked out once per node (10,000 nodes, not 80,000 ranks), a state's once per query, and the last
log line is read only for a rank that has one. ``RankFilter.select`` narrows a list word by word
(each keystroke at 80,000 ranks), ``RankFilter.__call__`` tests one rank: the same rules.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable

from mscon.console.engine.events import RankState
from mscon.console.engine.state_views import RankView
from mscon.console.views.log_lines import last_meaningful

RankTest = Callable[[RankView, bool], bool]
# A word's rule: the ranks of a list it keeps, given the stragglers' names. One rank is tested as a
# list of one, so the rule is written once and a keystroke's pass over 80,000 ranks makes no call
# per rank.
WordRule = Callable[[list[RankView], Collection[str]], list[RankView]]


class WordKind(enum.Enum):
    NODE = "node:"
    STATE = "state:"
    STRAGGLER = "straggler"


def _nodes_with(word: str, ranks: list[RankView]) -> set[str]:
    """The nodes of ``ranks`` with ``word`` in their name: each node's name looked at once."""
    return {node for node in {r.node for r in ranks} if word in node.lower()}


def _stragglers(ranks: list[RankView], stragglers: Collection[str]) -> list[RankView]:
    return [r for r in ranks if r.name in stragglers]


def _word_rule(word: str) -> WordRule:
    if word.startswith(WordKind.NODE.value):
        part = word[len(WordKind.NODE.value) :]

        def on_node(ranks: list[RankView], stragglers: Collection[str]) -> list[RankView]:
            hits = _nodes_with(part, ranks)
            return [r for r in ranks if r.node in hits]

        return on_node
    if word.startswith(WordKind.STATE.value):
        want = word[len(WordKind.STATE.value) :]
        if want == WordKind.STRAGGLER.value:
            return _stragglers
        states = frozenset(s for s in RankState if s.value.startswith(want))
        return lambda ranks, stragglers: [r for r in ranks if r.state in states]
    if word == WordKind.STRAGGLER.value:
        return _stragglers
    # Anywhere: the state, the node, the whole name, or the last line (read only if there is one).
    states = frozenset(s for s in RankState if word in s.value)
    n = len(word)

    def anywhere(ranks: list[RankView], stragglers: Collection[str]) -> list[RankView]:
        hits = _nodes_with(word, ranks)
        return [
            r
            for r in ranks
            if r.node in hits
            or r.state in states
            or (len(r.name) == n and r.name.lower() == word)
            or (r.tail and word in last_meaningful(r.tail).lower())
        ]

    return anywhere


class RankFilter:
    def __init__(self, query: str) -> None:
        self.query = query
        self._rules = [_word_rule(w.lower()) for w in query.split()]

    def __call__(self, r: RankView, straggler: bool) -> bool:
        stragglers = (r.name,) if straggler else ()
        return all(rule([r], stragglers) for rule in self._rules)

    def select(self, ranks: Iterable[RankView], stragglers: Collection[str]) -> list[RankView]:
        """The ranks the query selects, in their order: narrowed word by word."""
        out = list(ranks)
        for rule in self._rules:
            out = rule(out, stragglers)
        return out


def rank_filter(query: str) -> RankTest:
    return RankFilter(query)
