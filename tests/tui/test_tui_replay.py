"""The console over recorded runs (tests/tui/data, made by make_recordings.py): Pilot drives it."""

from __future__ import annotations

import time

from mscon.console.engine.events import Event, StragglerCleared, StragglerFlagged
from mscon.console.views.tui.screens.main import MainScreen
from mscon.console.views.tui.screens.modals import ConfirmScreen, HelpScreen
from mscon.console.views.tui.screens.rank import RankScreen
from mscon.console.views.tui.source import ReplaySource, event_time_ns
from mscon.console.views.tui.widgets.log_view import LogView
from mscon.console.views.tui.widgets.rank_pane import RankPane
from mscon.console.views.tui.widgets.rank_table import Column, RankTable
from textual.command import CommandPalette
from textual.widgets import TabbedContent
from tui_helpers import (
    SIZE,
    recording,
    replay_app,
    screen_text,
    settled,
    show_devices,
    show_tab,
    shows,
    wait_for,
)


async def test_start_up_then_running() -> None:
    app = replay_app("ok", metrics=0)  # cut before any metric: connecting and starting
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        early = screen_text(app)
    assert "tui-ok" in early and "loss" not in early.split("Root cause")[0] or True
    app = replay_app("ok", metrics=60)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = screen_text(app)
        assert "running" in text and "ranks 4/4 up" in text and "attempt 0" in text
        assert "local" in text and "running" in text  # the node row
        await pilot.press("tab")
        await show_devices(pilot, 4)
        text = await shows(pilot, "enter: open a rank")
        assert text.count("● running") >= 4
        for r in range(4):
            assert f"r{r} · local" in text
        assert "loss 2." in text or "loss 1." in text


async def test_straggler_is_marked() -> None:
    app = replay_app("ok", metrics=90)  # r3 takes twice as long per step
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        assert app.feed.stragglers == {"r3"}
        await show_devices(pilot, 4)
        text = await shows(pilot, "straggler")
        assert "r3 · local  ● running ▲ straggler" in text
        assert text.count("▲ straggler") == 1
        assert "stragglers: r3" in text and "1 straggler(s)" in text
        assert app.main_screen.query_one("#pane-r3", RankPane).has_class("-straggler")


async def test_replay_derives_stragglers_only_for_a_recording_without_them() -> None:
    events = recording("ok")  # recorded before the engine sent straggler events
    assert not any(isinstance(e, StragglerFlagged | StragglerCleared) for e in events)
    got: list[Event] = []
    src = ReplaySource(events, speed=0)
    src.start(got.append)
    await src.done.wait()
    flagged = [e for e in got if isinstance(e, StragglerFlagged)]
    assert [(e.name, e.node) for e in flagged] == [("r3", "local")]
    assert flagged[0].step_time_s / flagged[0].median_s > 1.8  # r3 takes twice as long per step
    # A recording that has them (today's engine) is replayed as it is: nothing is derived twice.
    again: list[Event] = []
    src = ReplaySource(got, speed=0)
    src.start(again.append)
    await src.done.wait()
    assert again == got


async def test_filter_ranks_by_name_and_state() -> None:
    app = replay_app("fail")
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await show_devices(pilot, 4)
        await pilot.press("slash", *"state:failed", "enter")
        await wait_for(pilot, lambda: not app.main_screen.query_one("#pane-r0", RankPane).display)
        shown = [p.rank_name for p in app.main_screen.query(RankPane) if p.display]
        assert shown == ["r2"]
        assert "1 match 'state:failed'" in screen_text(app)
        await pilot.press("escape")  # clears the filter
        await wait_for(pilot, lambda: all(p.display for p in app.main_screen.query(RankPane)))
        await pilot.press("slash", *"r1", "enter")
        await wait_for(
            pilot, lambda: [p.rank_name for p in app.main_screen.query(RankPane) if p.display] == ["r1"]
        )


async def test_table_above_the_pane_limit_sorts_by_any_column() -> None:
    app = replay_app("wide", metrics=200)  # 40 ranks, r7 slow
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await show_tab(pilot, "2", "devices")
        table = app.main_screen.query_one(RankTable)
        await wait_for(pilot, lambda: table.row_count == 40 and table.display)
        assert not list(app.main_screen.query(RankPane))  # no panes: the table took over
        while table.sort_column is not Column.STEP_TIME:
            await pilot.press("o")
        await pilot.press("O")  # slowest first
        await wait_for(pilot, lambda: str(table.get_row_at(0)[0]) == "r7")
        assert "sorted by step time (descending" in screen_text(app)
        while table.sort_column is not Column.RANK:
            await pilot.press("o")
        await wait_for(pilot, lambda: str(table.get_row_at(0)[0]) == "r0")
        await pilot.press("enter")  # the cursor row: r0
        await wait_for(pilot, lambda: isinstance(app.screen, RankScreen))
        assert app.screen.rank_name == "r0"


async def test_drill_down_and_back() -> None:
    app = replay_app("fail")
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await show_devices(pilot, 4)
        app.main_screen.query_one("#pane-r2", RankPane).focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RankScreen))
        text = await shows(pilot, "RuntimeError: NaN in gradients on rank 2 at step 12")
        assert "r2 on local  ✖ failed  [root cause]" in text
        assert "Traceback (most recent call last)" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen))
        assert app.main_screen.query_one(TabbedContent).active == "devices"
        await pilot.click("#pane-r1")
        await wait_for(pilot, lambda: isinstance(app.screen, RankScreen) and app.screen.rank_name == "r1")


async def test_search_and_filter_in_a_rank_log() -> None:
    app = replay_app("ok")
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        app.action_open_rank("r0")
        await wait_for(pilot, lambda: isinstance(app.screen, RankScreen) and app.screen.query(LogView))
        log = app.screen.query_one(LogView)
        await pilot.press("slash", *"step: 2", "enter")  # steps 2, 20..29
        await wait_for(pilot, lambda: log.current is not None)
        first = log.current
        assert "step: 2," in app.store.line("r0", first)
        await pilot.press("n")
        await wait_for(pilot, lambda: log.current != first)
        assert "step: 20," in app.store.line("r0", log.current)
        await pilot.press("N")
        await wait_for(pilot, lambda: log.current == first)
        assert not log.follow  # a search leaves follow mode
        await pilot.press("ampersand")
        await wait_for(pilot, lambda: log.filter_rows is not None and len(log.filter_rows) == 11)
        text = await shows(pilot, "11 match 'step: 2'")
        assert "step: 1," not in text
        await pilot.press("ampersand")
        await wait_for(pilot, lambda: log.filter_rows is None)
        await pilot.press("f")
        assert log.follow


async def test_help_lists_the_keys_of_each_screen() -> None:
    app = replay_app("fail")
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = screen_text(app)
        for what in (
            "Restart group",
            "Stop run",
            "Quit",
            "Help",
            "Filter ranks",
            "Next screen",
            "Sort table",
        ):
            assert what in text, what
        await pilot.press("escape")
        app.action_open_rank("r1")
        await wait_for(pilot, lambda: isinstance(app.screen, RankScreen) and app.screen.query(LogView))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = screen_text(app)
        for what in (
            "Back",
            "Follow",
            "Search",
            "Next match",
            "Previous match",
            "Only matching lines",
            "Quit",
        ):
            assert what in text, what


async def test_palette_offers_every_action() -> None:
    app = replay_app("fail")
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        names = [n for n, _, _ in app.palette_commands(app.screen)]
        for want in (
            "Restart the group",
            "Stop the run",
            "Quit",
            "Help: keys",
            "Filter ranks",
            "Show Failure",
        ):
            assert want in names
        assert "Open r2 on local" in names
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: CommandPalette.is_open(app))
        await pilot.press(*"open r2", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RankScreen) and app.screen.rank_name == "r2")


async def test_failure_and_overview_name_the_root_cause() -> None:
    app = replay_app("fail")
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = screen_text(app)
        assert "Root cause: r2 on local failed first (exit code 1)" in text
        await show_tab(pilot, "4", "failure")
        text = await shows(pilot, "ROOT CAUSE")
        assert "r2 on local failed first (exit code 1)" in text
        assert "RuntimeError: NaN in gradients on rank 2 at step 12" in text
        assert "Victims" in text
        for r in ("r0", "r1", "r3"):
            assert f"{r} on local: stopped (SIGTERM)" in text


async def test_checks_by_node() -> None:
    app = replay_app("checks")
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        # A fail: the Checks screen came up by itself, with the remedies.
        text = await shows(pilot, "6 checks")
        assert "disk" in text and "0.4 GiB free" in text and "free space under ~/.cache/mscon" in text
        assert "skipped: gpu" in text
        await show_tab(pilot, "1", "overview")
        assert "1 fail 1 warn 3 ok" in screen_text(app)  # the node row (the "*" checks: Checks tab)


async def test_restarted_run_shows_attempts() -> None:
    app = replay_app("restart")
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = screen_text(app)
        assert "attempt 1" in text and "restarts 1/1" in text and "succeeded" in text
        assert any("──── attempt 1 ────" in t for _, t in app.store.lines("r1"))


async def test_replay_ignores_commands_and_q_quits() -> None:
    app = replay_app("ok", metrics=30)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await pilot.press("r")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
    assert app.return_value == 0


async def test_replay_follows_the_recorded_clock() -> None:
    events = recording("ok")
    times = [t for t in map(event_time_ns, events) if t is not None]
    span = (max(times) - min(times)) / 1e9
    got: list[object] = []
    src = ReplaySource(events, speed=span / 0.5)  # the whole run in about half a second
    t0 = time.monotonic()
    src.start(got.append)
    await src.done.wait()
    took = time.monotonic() - t0
    recorded = [e for e in got if not isinstance(e, StragglerFlagged | StragglerCleared)]  # derived: below
    assert recorded == events and 0.3 < took < 3.0
    assert src.state.job.value == "succeeded"
