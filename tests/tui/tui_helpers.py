"""Shared helpers of the console tests: replayed apps, waiting on the screen, reading it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from mscon.agent.protocol import Metric, MetricBatch
from mscon.console.engine.events import AgentEvent, Event
from mscon.console.history.recording import read_recording
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.source import ReplaySource
from textual.app import App
from textual.pilot import Pilot

DATA = Path(__file__).resolve().parent / "data"
SIZE = (130, 40)


def recording(name: str) -> list[Event]:
    return list(read_recording(DATA / f"{name}.jsonl"))


def upto_metrics(events: list[Event], n: int) -> list[Event]:
    """The recording cut after its ``n``-th metric: a run in full swing, frozen."""
    seen = 0
    for i, ev in enumerate(events):
        if isinstance(ev, AgentEvent) and isinstance(ev.msg, Metric):
            seen += 1
            if seen == n:
                return events[: i + 1]
    return events


def replay_app(name: str, metrics: int | None = None, **options: object) -> MsconApp:
    events = recording(name)
    if metrics is not None:
        events = upto_metrics(events, metrics)
    options.setdefault("toasts", False)
    return MsconApp(ReplaySource(events, speed=0), **options)  # type: ignore[arg-type]


class SteppedReplay(ReplaySource):
    """A replay in parts: each part as fast as it goes, then a pause until the test sets ``go_on``
    (a run caught mid-way, without sleeping)."""

    def __init__(self, parts: list[list[Event]]) -> None:
        super().__init__([ev for part in parts for ev in part], speed=0)
        self.parts = parts
        self.go_on = asyncio.Event()
        self.parts_done = 0

    async def _run(self, handler: Callable[[Event], None]) -> int:
        code = 0
        for part in self.parts:
            if self.parts_done:
                await self.go_on.wait()
                self.go_on.clear()
            self.events = part
            code = await super()._run(handler)
            self.parts_done += 1
        return code


def split_after_metrics(events: list[Event], n: int) -> list[list[Event]]:
    """Two parts: up to the ``n``-th metric message (a Metric or a MetricBatch), then the rest."""
    seen = 0
    for i, ev in enumerate(events):
        if isinstance(ev, AgentEvent) and isinstance(ev.msg, Metric | MetricBatch):
            seen += 1
            if seen == n:
                return [events[: i + 1], events[i + 1 :]]
    raise AssertionError(f"the recording has {seen} metric messages, fewer than {n}")


def screen_text(app: App[object]) -> str:
    """The characters on screen, line by line (what a person reads)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip).rstrip() for strip in strips)


async def wait_for(pilot: Pilot[object], cond: Callable[[], object], limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting; screen:\n{screen_text(pilot.app)}")
        await pilot.pause(0.05)


async def settled(pilot: Pilot[object]) -> None:
    """The replay is over and the view has drawn all of it."""
    app = pilot.app
    assert isinstance(app, MsconApp)
    await app.source.done.wait()
    await wait_for(pilot, lambda: app._done_seen)
    await pilot.pause()


async def shows(pilot: Pilot[object], text: str, limit_s: float = 20.0) -> str:
    await wait_for(pilot, lambda: text in screen_text(pilot.app), limit_s)
    return screen_text(pilot.app)


async def show_tab(pilot: Pilot[object], key: str, tab: str) -> None:
    """Press a tab's key and wait until that tab is the one on screen."""
    from textual.widgets import TabbedContent

    app = pilot.app
    assert isinstance(app, MsconApp)
    await pilot.press(key)
    await wait_for(pilot, lambda: app.main_screen.query_one(TabbedContent).active == tab)


async def show_devices(pilot: Pilot[object], panes: int) -> None:
    from mscon.console.views.tui.widgets.rank_pane import RankPane

    app = pilot.app
    assert isinstance(app, MsconApp)
    await show_tab(pilot, "2", "devices")
    await wait_for(pilot, lambda: len(app.main_screen.query(RankPane)) == panes)
    await pilot.pause()
