"""Detach from the live console (`d`, and the quit dialog's Detach), then attach in the console again:
the run goes on without a console and the attached view rebuilds it (local transport, fake ranks)."""

from __future__ import annotations

from pathlib import Path

from conftest import kill_run, run_processes, wait_gone
from mscon.agent import layout
from mscon.console.config.inventory import load_inventory
from mscon.console.detach.attach import Attacher, AttachOptions
from mscon.console.detach.record import read_record
from mscon.console.engine.commands import StopJob
from mscon.console.engine.events import JobState
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.screens.modals import ConfirmScreen, QuitScreen
from mscon.console.views.tui.source import LiveSource
from test_tui_live import all_running, live_app
from tui_helpers import SIZE, shows, wait_for


async def test_detach_key_leaves_the_run_going_and_attach_takes_it_back(tmp_path: Path) -> None:
    app, source, run_id = live_app(tmp_path, ranks=2)
    try:
        await _detach_attach_stop(app, source, run_id, tmp_path)
    finally:
        kill_run(run_id)  # a failure half-way must not leave a detached run training for hours


async def _detach_attach_stop(app: MsconApp, source: LiveSource, run_id: str, tmp_path: Path) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all_running(source, 0), limit_s=60)
        await pilot.press("d")
        await wait_for(pilot, lambda: source.done.is_set(), limit_s=30)
        await wait_for(pilot, lambda: not app.is_running, limit_s=10)
    code = await source.finish()
    assert code == 0 and source.result is not None and source.result.status is JobState.DETACHED
    assert f"mscon attach {run_id}" in source.result.reason
    ranks = run_processes(run_id)
    assert len(ranks) >= 2, "the ranks run on without the console"
    record = read_record(tmp_path / "runs" / run_id)
    assert record is not None and record.attempt == 0

    # Attach in the console: the state is rebuilt (every rank running), then quit -> Detach again.
    inv = load_inventory(record.inventory)
    attacher = Attacher(inv, AttachOptions(run_id=run_id, logs_root=tmp_path / "runs", record=record))
    source2 = LiveSource(attacher)
    app2 = MsconApp(source2, toasts=False)
    async with app2.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all_running(source2, 0), limit_s=60)
        await shows(pilot, "ranks 2/2 up")
        # The operator's restart goes to node 0's coordinator, which restarts the group itself.
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app2.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: all_running(source2, 1), limit_s=60)
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app2.screen, QuitScreen))
        await pilot.press("d")
        await wait_for(pilot, lambda: source2.done.is_set(), limit_s=30)
    assert await source2.finish() == 0
    assert source2.result is not None and source2.result.status is JobState.DETACHED
    assert run_processes(run_id), "leaving an attached run never stops it"

    # A closing console does not stop an attached run either; `s` in an attached console does.
    attacher3 = Attacher(
        inv,
        AttachOptions(
            run_id=run_id, logs_root=tmp_path / "runs", record=read_record(tmp_path / "runs" / run_id)
        ),
    )
    source3 = LiveSource(attacher3)
    app3 = MsconApp(source3, toasts=False)
    async with app3.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all_running(source3, 1), limit_s=60)
        source3.submit(StopJob("stopped from the console"))
        await wait_for(pilot, lambda: source3.done.is_set(), limit_s=30)
    assert await source3.finish() == 130
    assert source3.result is not None and source3.result.status is JobState.INTERRUPTED
    assert [a.outcome.value for a in source3.result.attempts] == ["restart requested", "interrupted"]
    assert wait_gone(run_processes(run_id), 10) == []
    assert Path(layout.log_path(tmp_path / "runs" / run_id / "local", 1, "r0")).is_file()
