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
# A word's rule: the ranks of a list it keeps, given the stragglers' names and the nodes' names
# (None: those of the ranks). One rank is tested as a list of one, so the rule is written once and a
# keystroke's pass over 80,000 ranks makes no call per rank.
WordRule = Callable[[list[RankView], Collection[str], Iterable[str] | None], list[RankView]]


class WordKind(enum.Enum):
    NODE = "node:"
    STATE = "state:"
    STRAGGLER = "straggler"


def _nodes_with(word: str, ranks: list[RankView], nodes: Iterable[str] | None) -> set[str]:
    """The nodes with ``word`` in their name: each node's name looked at once (10,000 of them,
    where a pass over 80,000 ranks would be needed to find them)."""
    names = nodes if nodes is not None else {r.node for r in ranks}
    return {node for node in names if word in node.lower()}


def _stragglers(
    ranks: list[RankView], stragglers: Collection[str], nodes: Iterable[str] | None
) -> list[RankView]:
    return [r for r in ranks if r.name in stragglers]


def _word_rule(word: str) -> WordRule:
    if word.startswith(WordKind.NODE.value):
        part = word[len(WordKind.NODE.value) :]

        def on_node(
            ranks: list[RankView], stragglers: Collection[str], nodes: Iterable[str] | None
        ) -> list[RankView]:
            hits = _nodes_with(part, ranks, nodes)
            return [r for r in ranks if r.node in hits]

        return on_node
    if word.startswith(WordKind.STATE.value):
        want = word[len(WordKind.STATE.value) :]
        if want == WordKind.STRAGGLER.value:
            return _stragglers
        states = frozenset(s for s in RankState if s.value.startswith(want))
        return lambda ranks, stragglers, nodes: [r for r in ranks if r.state in states]
    if word == WordKind.STRAGGLER.value:
        return _stragglers
    # Anywhere: the state, the node, the whole name, or the last line (read only if there is one).
    states = frozenset(s for s in RankState if word in s.value)
    n = len(word)

    def anywhere(
        ranks: list[RankView], stragglers: Collection[str], nodes: Iterable[str] | None
    ) -> list[RankView]:
        hits = _nodes_with(word, ranks, nodes)
        return [  # the cheap tests first; an empty set is not even looked in
            r
            for r in ranks
            if (hits and r.node in hits)
            or (states and r.state in states)
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
        return all(rule([r], stragglers, None) for rule in self._rules)

    def select(
        self, ranks: Iterable[RankView], stragglers: Collection[str], nodes: Iterable[str] | None = None
    ) -> list[RankView]:
        """The ranks the query selects, in their order: narrowed word by word. ``nodes``: every
        node's name, where the caller has them (else the ranks' nodes are gathered)."""
        out = list(ranks)
        for rule in self._rules:
            out = rule(out, stragglers, nodes)
        return out


def rank_filter(query: str) -> RankTest:
    return RankFilter(query)
