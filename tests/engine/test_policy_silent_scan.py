"""The hang rule's scan each tick works out a rank's own limit only for ranks silent past the
shortest limit any rank can have: at 10,000 nodes x 8 ranks that scan ran every tick over every
rank, the most of the console's policy time (bench/scale.py --profile)."""

from __future__ import annotations

import pytest
from mscon.agent import policy as P

RANKS = 2000


def _running(timeout_s: float | None) -> P.RunPolicy:
    workers = {f"r{i}": f"n{i // 8}" for i in range(RANKS)}
    cfg = P.PolicyConfig(
        nodes=tuple(sorted(set(workers.values()))), workers=workers, hang_timeout_s=timeout_s
    )
    policy = P.RunPolicy(cfg)
    policy.step(P.Begin(0.0))
    for name, node in workers.items():
        policy.step(P.RankStarted(node, name, 0.0))
    return policy


@pytest.mark.parametrize("timeout_s", [None, 10.0])
def test_a_tick_looks_at_no_rank_that_spoke_within_the_shortest_limit(
    timeout_s: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _running(timeout_s)
    for i in range(RANKS):
        policy.step(P.StepReport(f"r{i}", 100.0 + (i % 2), 100.0))
        policy.step(P.StepReport(f"r{i}", 101.0 + (i % 2), 101.0))
    asked: list[str] = []
    limit = P.HangRule.limit
    monkeypatch.setattr(P.HangRule, "limit", lambda self, name, finishing=False: asked.append(name) or limit(
        self, name, finishing))  # fmt: skip
    assert not [a for a in policy.step(P.Tick(103.0)) if isinstance(a, P.Inspect)]
    assert asked == []
    # r7 falls silent: past the floor it is looked at, and past its own limit inspected.
    for i in range(RANKS):
        if i != 7:
            policy.step(P.RankProgress(f"r{i}", 140.0))
    inspected = [a for a in policy.step(P.Tick(141.0)) if isinstance(a, P.Inspect)]
    assert asked == ["r7"]
    assert [a.names for a in inspected] == [("r7",)]
