"""Which MindSpore test modules go in which of the suite's two groups (``_MINDSPORE_GROUP`` in
tests/conftest.py): a simulation of the rank slots over a measured run.

    PYTHONPATH=bench SUITE_TIMELINE=/tmp/t.jsonl .venv/bin/python -m pytest -p suite_timeline
    .venv/bin/python bench/suite_split.py /tmp/t.jsonl

Each group runs its tests one after another in collection order, a test starting once its slots are
free (first come, first served, as the turnstile in tests/conftest.py does); the other slot-holding
tests (Slurm's) hold theirs when they did in the run. Each test holds its slots for its measured
seconds less its set-up (the set-up of a MindSpore test is mostly its wait for slots). Prints the
simulated span of the run's own split and of the best splits found, each also as the mean and worst
of runs with every duration varied by -20 %..+25 %, and the best one as a dict to paste.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GROUPS = ("mindspore-a", "mindspore-b")


@dataclass(frozen=True)
class Test:
    id: str
    module: str
    group: str
    slots: int
    start: float  # in the run, seconds from its first test
    seconds: float  # holding its slots


def load(path: Path) -> tuple[list[Test], int]:
    """The slot-holding tests, and how many slots the suite had (tests/conftest.py said, per test)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    limits = {r["slot_limit"] for r in rows if "slot_limit" in r}
    if len(limits) != 1:
        raise SystemExit(
            f"{path}: no one rank-slot limit in it ({sorted(limits)}): rerun with suite_timeline"
        )
    t0 = min(r["start"] for r in rows)
    tests = []
    for r in sorted(rows, key=lambda r: r["start"]):
        if not r.get("slots"):
            continue
        group = r["id"].rsplit("@", 1)[1] if "@" in r["id"] else ""
        held = r["end"] - r["start"] - r.get("setup", 0.0)
        tests.append(Test(r["id"], r["id"].split("::")[0], group, r["slots"], r["start"] - t0, held))
    return tests, limits.pop()


def simulate(
    chains: Sequence[Sequence[tuple[int, float]]], fixed: Sequence[tuple[float, float, int]], limit: int
) -> float:
    """The span of ``chains`` (each a list of (slots, seconds), run in order) beside ``fixed`` slot
    use ((start, end, slots)) on ``limit`` slots, with a first-come, first-served gate."""
    now, pos, running = 0.0, [0] * len(chains), []  # running: heap of (end, chain, slots)
    queue = [c for c in range(len(chains)) if chains[c]]
    marks = sorted({t for s, e, _ in fixed for t in (s, e)})

    def fixed_use(t: float) -> int:
        return sum(n for s, e, n in fixed if s <= t < e)

    while queue or running:
        while queue:
            c = queue[0]
            slots, seconds = chains[c][pos[c]]
            if sum(n for _, _, n in running) + fixed_use(now) + min(slots, limit) > limit:
                break
            queue.pop(0)
            pos[c] += 1
            heapq.heappush(running, (now + seconds, c, min(slots, limit)))
        later = [m for m in marks if m > now]
        if running and (not later or running[0][0] <= later[0]):
            now, c, _ = heapq.heappop(running)
            if pos[c] < len(chains[c]):
                queue.append(c)
        elif later:
            now = later[0]
        else:
            raise RuntimeError("a test needs more slots than there are")
    return now


def split_chains(tests: Sequence[Test], first: frozenset[str]) -> list[list[Test]]:
    """The two groups' tests in collection order (module path, then the run's order)."""
    order = sorted(tests, key=lambda t: (t.module, t.start))
    return [[t for t in order if t.module in first], [t for t in order if t.module not in first]]


def score(
    tests: Sequence[Test],
    first: frozenset[str],
    fixed: Sequence[tuple[float, float, int]],
    limit: int,
    trials: int,
) -> tuple[float, float, float]:
    """(span with the measured durations, mean and worst span with varied ones)."""
    chains = split_chains(tests, first)
    exact = simulate([[(t.slots, t.seconds) for t in c] for c in chains], fixed, limit)
    rng = random.Random(1)
    varied = [
        simulate([[(t.slots, t.seconds * rng.uniform(0.8, 1.25)) for t in c] for c in chains], fixed, limit)
        for _ in range(trials)
    ]
    return exact, sum(varied) / trials, max(varied)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline", type=Path, help="the JSON lines bench/suite_timeline.py wrote")
    ap.add_argument(
        "--balance", type=float, default=50.0, help="at most this many seconds between the groups' sums"
    )
    ap.add_argument("--trials", type=int, default=8, help="runs with varied durations for each candidate")
    ap.add_argument("--show", type=int, default=3, help="this many best splits")
    args = ap.parse_args()

    everything, limit = load(args.timeline)
    tests = [t for t in everything if t.group in GROUPS]
    fixed = [(t.start, t.start + t.seconds, t.slots) for t in everything if t.group not in GROUPS]
    modules = sorted({t.module for t in tests})
    cost = {m: sum(t.seconds for t in tests if t.module == m) for m in modules}
    own = frozenset(t.module for t in tests if t.group == GROUPS[0])
    exact, mean, worst = score(tests, own, fixed, limit, args.trials)
    bound = sum(t.slots * t.seconds for t in everything) / limit
    print(
        f"{len(tests)} MindSpore tests in {len(modules)} modules, {sum(cost.values()):.0f} s; "
        f"slot bound {bound:.0f} s"
    )
    print(f"the run's split: {exact:.0f} s (varied: mean {mean:.0f}, worst {worst:.0f})")

    candidates = []
    for mask in range(1 << (len(modules) - 1)):  # the last module always in the second group
        first = frozenset(m for k, m in enumerate(modules) if mask >> k & 1)
        a = sum(cost[m] for m in first)
        if abs(a - (sum(cost.values()) - a)) <= args.balance:
            chains = split_chains(tests, first)
            candidates.append(
                (simulate([[(t.slots, t.seconds) for t in c] for c in chains], fixed, limit), first)
            )
    candidates.sort(key=lambda c: c[0])
    ranked = sorted(
        ((score(tests, first, fixed, limit, args.trials), first) for _, first in candidates[: 8 * args.show]),
        key=lambda c: c[0][1],
    )
    for (exact, mean, worst), first in ranked[: args.show]:
        print(f"\n{exact:.0f} s (varied: mean {mean:.0f}, worst {worst:.0f}):")
        for name, group in ((GROUPS[0], first), (GROUPS[1], frozenset(modules) - first)):
            for m in sorted(group, key=lambda m: -cost[m]):
                print(f'    "{m}": "{name[-1]}",  # {cost[m]:.0f}')


if __name__ == "__main__":
    main()
