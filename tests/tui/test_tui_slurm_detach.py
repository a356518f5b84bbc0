"""`d` (and the quit dialog's Detach) is refused under Slurm, as the ``--detach`` flag is: the srun
step ends with the console, and a detach secret would cross the Slurm link. The run behind the
console is a stand-in that records the commands it gets (no allocation needed)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from mscon.console.engine.bus import EventBus
from mscon.console.engine.commands import Command, DetachRun, StopJob
from mscon.console.engine.events import JobState, RunResult
from mscon.console.engine.state import ClusterState
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.screens.modals import QuitScreen
from mscon.console.views.tui.source import LiveSource
from tui_helpers import SIZE, wait_for


class FakeRun:
    """What LiveSource drives: a supervisor whose inventory is ``slurm``-backed (or not)."""

    def __init__(self, slurm: bool) -> None:
        self.inv = SimpleNamespace(slurm=SimpleNamespace(devices=1) if slurm else None)
        self.state = ClusterState()
        self.bus = EventBus()
        self.commands: list[Command] = []
        self._ended = asyncio.Event()

    def submit(self, cmd: Command) -> None:
        self.commands.append(cmd)
        if isinstance(cmd, StopJob | DetachRun):
            self._ended.set()

    def closing_command(self) -> Command:
        return StopJob("the console was closed")

    async def run(self) -> RunResult:
        await self._ended.wait()
        detached = any(isinstance(c, DetachRun) for c in self.commands)
        status = JobState.DETACHED if detached else JobState.INTERRUPTED
        return RunResult("fake", status, 0 if detached else 130, "", None, (), 0.0, "")


def _told(app: MsconApp, text: str) -> bool:
    return any(text in str(n.message) for n in app._notifications)


async def test_detach_is_refused_under_slurm() -> None:
    run = FakeRun(slurm=True)
    source = LiveSource(run)  # type: ignore[arg-type]
    app = MsconApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await wait_for(pilot, lambda: _told(app, "Detach is not possible with Slurm nodes"))
        app.clear_notifications()
        await pilot.press("q")  # the quit dialog's Detach goes the same way
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("d")
        await wait_for(pilot, lambda: _told(app, "Detach is not possible with Slurm nodes"))
        assert not any(isinstance(c, DetachRun) for c in run.commands), run.commands
        assert app.is_running and not source.done.is_set()
    assert not any(isinstance(c, DetachRun) for c in run.commands)


async def test_detach_still_goes_through_without_slurm() -> None:
    run = FakeRun(slurm=False)
    source = LiveSource(run)  # type: ignore[arg-type]
    app = MsconApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await wait_for(pilot, lambda: source.done.is_set(), limit_s=10)
    assert [type(c) for c in run.commands] == [DetachRun]
