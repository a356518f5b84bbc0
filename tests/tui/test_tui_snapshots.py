"""Snapshots of every screen, from recordings (pytest-textual-snapshot; update with --snapshot-update
only after checking the report). Deterministic: the replay's clock is the recording's, pop-ups are
off, and the terminal size is fixed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.screens.modals import HelpScreen
from mscon.console.views.tui.screens.rank import RankScreen
from mscon.console.views.tui.widgets.log_view import LogView
from textual.pilot import Pilot
from tui_helpers import replay_app, settled, show_devices, show_tab, wait_for

pytest.importorskip("pytest_textual_snapshot")

SIZE = (120, 36)
Before = Callable[[Pilot[object]], Awaitable[None]]


def then(*steps: Before) -> Before:
    async def run(pilot: Pilot[object]) -> None:
        await settled(pilot)
        for step in steps:
            await step(pilot)
        await pilot.pause()

    return run


def tab(key: str, name: str) -> Before:
    return lambda pilot: show_tab(pilot, key, name)


def devices(panes: int) -> Before:
    return lambda pilot: show_devices(pilot, panes)


def rank(name: str) -> Before:
    async def run(pilot: Pilot[object]) -> None:
        app = pilot.app
        assert isinstance(app, MsconApp)
        app.action_open_rank(name)
        await wait_for(pilot, lambda: isinstance(app.screen, RankScreen) and app.screen.query(LogView))
        await pilot.pause(0.3)

    return run


async def no_notes(pilot: Pilot[object]) -> None:
    """Without the pop-up the recorded preflight warning brings (it would time out)."""
    pilot.app.clear_notifications()


async def help_keys(pilot: Pilot[object]) -> None:
    await pilot.press("question_mark")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))


def test_overview_with_root_cause(snap_compare) -> None:
    assert snap_compare(replay_app("fail"), terminal_size=SIZE, run_before=then())


def test_overview_after_a_short_run(snap_compare) -> None:
    # inventory/local.yaml: 40 steps in well under a second, every one on the plots after the end
    assert snap_compare(replay_app("short"), terminal_size=SIZE, run_before=then(no_notes))


def test_devices_panes_with_a_straggler(snap_compare) -> None:
    assert snap_compare(replay_app("ok", metrics=90), terminal_size=SIZE, run_before=then(devices(4)))


def test_devices_table_of_40_ranks(snap_compare) -> None:
    app = replay_app("wide", metrics=200)
    assert snap_compare(app, terminal_size=SIZE, run_before=then(tab("2", "devices")))


def test_rank_log_with_traceback(snap_compare) -> None:
    assert snap_compare(replay_app("fail"), terminal_size=SIZE, run_before=then(rank("r2")))


def test_checks(snap_compare) -> None:
    assert snap_compare(replay_app("checks"), terminal_size=SIZE, run_before=then(tab("3", "checks")))


def test_failure(snap_compare) -> None:
    assert snap_compare(replay_app("fail"), terminal_size=SIZE, run_before=then(tab("4", "failure")))


def test_help(snap_compare) -> None:
    assert snap_compare(replay_app("fail"), terminal_size=SIZE, run_before=then(help_keys))
