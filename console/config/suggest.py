"""The known spelling closest to a misspelt key or value ("did you mean"), for one-line errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Suggestion:
    choice: str = ""  # the known spelling meant, "" when nothing is close
    hint: str = ""  # what the message appends: ": did you mean X?" (and a case note)


def did_you_mean(given: str, known: Iterable[str], what: str = "values") -> Suggestion:
    """The entry of ``known`` closest to ``given``, naming a difference of case alone (``gpu`` for
    ``GPU``: "(values are case-sensitive)")."""
    choices = list(known)
    folded = given.casefold()
    same_but_case = [c for c in choices if c.casefold() == folded and c != given]
    if same_but_case:
        meant = same_but_case[0]
        return Suggestion(meant, f": did you mean {meant}? ({what} are case-sensitive)")
    by_fold = {c.casefold(): c for c in choices}
    close = difflib.get_close_matches(folded, list(by_fold), n=1, cutoff=0.6)
    if not close:
        return Suggestion()
    meant = by_fold[close[0]]
    return Suggestion(meant, f": did you mean {meant}?")
