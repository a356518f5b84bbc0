"""The README's screenshot: the live console's Overview mid-run, 2 nodes x 2 MindSpore ranks.

    .venv/bin/python bench/screenshot.py [--out docs/screenshot.svg] [--metrics 300]

It replays tests/tui/data/cluster.jsonl (a real ``mscon run --events`` of the project's trainer on
two loopback sshd nodes, 2 ranks each: ``PYTHONPATH=.dev .venv/bin/python tests/tui/make_recordings.py
cluster`` records it again) up to its ``--metrics``-th metric message, the run caught mid-way, and
saves what the console draws then. The status bar says "live", as it did during that run: the
screen is the one the live console showed for the same events (a replay draws from them alone).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "tui"))

from mscon.console.views.tui.app import MsconApp  # noqa: E402
from mscon.console.views.tui.source import ReplaySource  # noqa: E402
from tui_helpers import recording, settled, split_after_metrics  # noqa: E402

SIZE = (130, 40)


class AsLive(ReplaySource):
    @property
    def title(self) -> str:
        return "live"


async def shoot(out: Path, metrics: int) -> None:
    events = split_after_metrics(recording("cluster"), metrics)[0]
    app = MsconApp(AsLive(events, speed=0), toasts=False)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        app.clear_notifications()  # the recorded preflight warning's pop-up
        await pilot.pause(0.2)
        out.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=out.name, path=str(out.parent))
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "screenshot.svg")
    p.add_argument("--metrics", type=int, default=300, help="replay up to this metric message")
    a = p.parse_args()
    asyncio.run(shoot(a.out, a.metrics))


if __name__ == "__main__":
    main()
