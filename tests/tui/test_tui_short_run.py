"""The console after a short run (the README's first job: 2 MindSpore ranks, 40 steps in well under
a second, recorded as tests/tui/data/short.jsonl): the Overview plots every step received, during
the run and after its end, with axes that say what they measure; the panes' last line is the
rank's last meaningful line, not MindSpore's INFO chatter (which stays in the rank's log)."""

from __future__ import annotations

from mscon.agent.protocol import LogBatch, MetricBatch
from mscon.console.engine.events import AgentEvent, Event
from mscon.console.views.log_lines import is_chatter
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.screens.rank import RankScreen
from mscon.console.views.tui.widgets.log_view import LogView
from mscon.console.views.tui.widgets.plots import SeriesPlot
from mscon.console.views.tui.widgets.rank_pane import RankPane
from textual.widgets import Label
from tui_helpers import (
    SIZE,
    SteppedReplay,
    recording,
    screen_text,
    settled,
    show_devices,
    split_after_metrics,
    wait_for,
)


def steps_in(events: list[Event]) -> list[float]:
    """Every step some rank reported (this trainer numbers its steps through the run)."""
    return sorted(
        {
            float(m.step)
            for ev in events
            if isinstance(ev, AgentEvent) and isinstance(ev.msg, MetricBatch)
            for m in ev.msg.metrics
        }
    )


def plots(app: MsconApp) -> tuple[SeriesPlot, SeriesPlot]:
    screen = app.main_screen
    return screen.query_one("#loss-plot", SeriesPlot), screen.query_one("#throughput-plot", SeriesPlot)


def braille_dots(app: MsconApp) -> int:
    return sum(1 for ch in screen_text(app) if 0x2801 <= ord(ch) <= 0x28FF)


async def test_the_overview_plots_every_step_during_and_after_a_short_run() -> None:
    events = recording("short")
    parts = split_after_metrics(events, 4)  # each rank's first metric batches: the run mid-way
    during, total = steps_in(parts[0]), steps_in(events)
    assert 0 < len(during) < len(total) == 40
    source = SteppedReplay(parts)
    app = MsconApp(source, toasts=False)
    async with app.run_test(size=SIZE) as pilot:
        loss, thr = plots(app)
        await wait_for(pilot, lambda: source.parts_done == 1 and not app.feed.backlog)
        await wait_for(pilot, lambda: list(loss.data[0]) == during)
        assert list(thr.data[0]) == during and not source.done.is_set()
        assert all(y > 0 for y in loss.data[1] + thr.data[1])
        await pilot.pause()
        assert braille_dots(app) > 0  # drawn, not only held
        source.go_on.set()
        await settled(pilot)
        assert list(loss.data[0]) == total and list(thr.data[0]) == total
        # the end of the run (attempt ended, run finished) leaves every point on the plots
        await pilot.pause(0.3)
        assert list(loss.data[0]) == total and list(thr.data[0]) == total
        assert braille_dots(app) > 40
        text = screen_text(app)
        assert "cluster loss (mean over ranks)" in text and "cluster throughput (all ranks)" in text
        assert (loss.x_label, loss.y_label, thr.y_label) == ("step", "loss", "samples/s")
        assert "step" in text and "samples/s" in text


async def test_panes_end_on_the_last_meaningful_line_and_the_log_keeps_the_chatter() -> None:
    events = recording("short")
    last_lines = {
        ev.msg.name: ev.msg.lines[-1]
        for ev in events
        if isinstance(ev, AgentEvent) and isinstance(ev.msg, LogBatch) and ev.msg.lines
    }
    assert last_lines["r0"].startswith("[INFO] DISTRIBUTED(") and is_chatter(last_lines["r0"])
    app = MsconApp(SteppedReplay([events]), toasts=False)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await show_devices(pilot, 2)
        for pane in app.main_screen.query(RankPane):
            last = str(pane.query_one("#last", Label).render())
            assert last.startswith("training finished: 40 steps"), last
        assert "Event base dispatch" not in screen_text(app)
        # the chatter is kept: in the rank's log, and on its screen at the end of the log
        store = app.store
        assert is_chatter(store.line("r0", store.count("r0") - 1))
        app.action_open_rank("r0")
        await wait_for(pilot, lambda: isinstance(app.screen, RankScreen) and app.screen.query(LogView))
        await pilot.press("end")
        last_row = f"{store.count('r0')} {last_lines['r0'][:50]}"  # its line number, then the line
        await wait_for(pilot, lambda: last_row in screen_text(app))
