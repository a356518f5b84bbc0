"""The policy's SilenceWatch (agent/policy.py): the ranks near their hang limit, found from a heap of
moments, must be exactly those a pass over every rank finds, whatever the order of progress,
limits that grow and ranks watched or not."""

from __future__ import annotations

import random

from mscon.agent.policy import SilenceWatch, silent_too_long

EARLY = 1.0
FLOOR = 9.0


def _scan(last: dict[str, float], now: float, limits: dict[str, float], watched: set[str]) -> list[str]:
    """What the policy computed before: every watched rank's silence against its limit less EARLY."""

    def near(n: str) -> bool:
        return silent_too_long(last[n], now, limits[n]) or silent_too_long(last[n], now, limits[n] - EARLY)

    return sorted(n for n in watched if n in last and near(n))


def limits_now(limits: dict[str, float]):  # noqa: ANN201 - the policy's limit_of
    return lambda n: (limits[n], "why")


def test_the_heap_finds_what_a_pass_over_every_rank_finds() -> None:
    rng = random.Random(44)
    for _ in range(20):
        names = [f"r{i}" for i in range(rng.randint(1, 60))]
        last: dict[str, float] = {}
        floor = rng.choice([FLOOR, 0.3])  # a limit under EARLY (tests set hang.timeout_s so low)
        watch = SilenceWatch(floor)
        limits = {n: floor + rng.choice([0.0, 1.0, 5.0, 30.0]) for n in names}
        watched = set(names)
        now = 0.0
        for _ in range(400):
            now += rng.choice([0.05, 0.25, 1.0, 3.0])
            for n in rng.sample(names, rng.randint(0, len(names))):
                if rng.random() < 0.3:
                    # a report that took longer on its way: the past, as a coordinator's may be
                    when = now - rng.uniform(0, 5)
                    if when > last.get(n, float("-inf")):
                        last[n] = when
                        watch.set(n, when)
                elif rng.random() < 0.5:
                    last[n] = now
                    watch.set(n, now)
            if rng.random() < 0.1:  # a limit only grows (a longer gap between steps, a worker done)
                grown = rng.choice(names)
                limits[grown] += rng.uniform(0, 20)
            if rng.random() < 0.1:  # inspected or exited: not watched until its next progress
                gone = rng.choice(names)
                watched.discard(gone)
            if rng.random() < 0.1:
                back = rng.choice(names)
                watched.add(back)
                last[back] = now
                watch.set(back, now)
            found = watch.near(now, EARLY, limits_now(limits), watched.__contains__)
            assert sorted(n for n, *_ in found) == _scan(last, now, limits, watched), now
            assert all(w == last[n] and lim == limits[n] for n, w, lim, _ in found)


def test_a_rank_that_keeps_progressing_leaves_the_heap_small() -> None:
    watch = SilenceWatch(FLOOR)
    for t in range(20_000):
        watch.set("r0", float(t))
        watch.set("r1", float(t))
    assert len(watch._heap) <= 4 * 2 + 1024  # noqa: SLF001 - the bound is the point
    assert watch.near(20_000.0 + FLOOR, EARLY, lambda n: (FLOOR, "floor"), lambda n: True) == [
        ("r0", 19_999.0, FLOOR, "floor"),
        ("r1", 19_999.0, FLOOR, "floor"),
    ]
