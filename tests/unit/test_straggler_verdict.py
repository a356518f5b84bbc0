"""The one straggler rule (``stragglers.straggler_verdict``) as a table, and the three hosts that
derive straggler events (the supervisor, an attach, a replayed recording) going through it."""

from __future__ import annotations

import inspect

import pytest
from mscon.console.detach import attach
from mscon.console.engine import stragglers as S
from mscon.console.engine import supervisor
from mscon.console.views.tui import source

POLICY = S.StragglerPolicy(factor=1.5, min_excess_s=0.01)  # clears below 1.25x


@pytest.mark.parametrize(
    ("flagged", "own", "yardstick", "want"),
    [
        (False, 0.16, 0.1, True),  # 1.6x, 60 ms slower: flagged
        (False, 0.149, 0.1, None),  # under the factor
        (False, 0.0015, 0.001, None),  # 1.5x but half a millisecond: not a straggler
        (True, 0.14, 0.1, None),  # flagged and still over the release: stays
        (True, 0.125, 0.1, None),  # at the release, not below it
        (True, 0.12, 0.1, False),  # below it: cleared
    ],
)
def test_straggler_verdict(flagged: bool, own: float, yardstick: float, want: bool | None) -> None:
    assert S.straggler_verdict(POLICY, flagged, own, yardstick) is want


def test_every_host_derives_stragglers_with_the_one_watch() -> None:
    """The watch's comparison is the verdict function; each host builds the watch, none its own."""
    assert "straggler_verdict(" in inspect.getsource(S.StragglerWatch._compare)
    for host in (supervisor, attach, source):
        text = inspect.getsource(host)
        assert "StragglerWatch(" in text and "is_straggler(" not in text and "clear_below" not in text
