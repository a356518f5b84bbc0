"""Overview: the nodes, the cluster's loss and throughput over time, and the root cause once known."""

from __future__ import annotations

import time

from mscon.console.engine.events import ResumeVerdict
from mscon.console.engine.phases import describe_graph
from mscon.console.engine.resume import describe_resume
from mscon.console.engine.root_cause import describe
from mscon.console.views import plain
from mscon.console.views.tui import fmt
from mscon.console.views.tui.feed import Changes
from mscon.console.views.tui.model import ViewModel
from mscon.console.views.tui.series import SAMPLES_UNIT
from mscon.console.views.tui.startup import breakdown, phases, starting
from mscon.console.views.tui.widgets.node_table import NodeTable
from mscon.console.views.tui.widgets.plots import SeriesPlot
from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

THROUGHPUT_TITLE = "cluster throughput (all ranks)"
PLOT_S = 1.0  # the plots are drawn at most this often (new points wait for the next draw)


def summary_text(model: ViewModel) -> Text:
    st = model.state
    att = st.attempt
    text = Text()
    text.append("job ")
    text.append_text(fmt.job_state(st.job))
    text.append(f"   elapsed {plain.elapsed(model.elapsed_s())}")
    text.append(f"   attempt {att.number if att else '-'}")
    text.append(f"   restarts used {model.restarts_used()} of {st.max_restarts}")
    up, _, total = model.rank_counts()
    text.append(f"   ranks {up}/{total} up")
    if att is not None and att.number > 0:  # where the restart's ranks started, once one has said
        resumed = st.resume(att)
        if resumed is not None and resumed.verdict is not ResumeVerdict.UNKNOWN:
            bad = resumed.verdict in (ResumeVerdict.STARTED_OVER, ResumeVerdict.REFUSED, ResumeVerdict.MIXED)
            line = f"attempt {att.number}: {plain.printable(describe_resume(resumed))}"
            text.append(f"\n{line}", style=fmt.STARTED_OVER_STYLE if bad else "")
    timed = st.phases(att) if att is not None else None
    graph = describe_graph(timed) if timed is not None else None
    if att is not None and graph is not None:  # whether the compile cache spared this attempt's compile
        text.append(f"\nattempt {att.number}: {graph}", style="dim")
    for note in list(model.feed.notices)[-3:]:
        text.append(f"\n{fmt.line(note, 200)}", style="dim")
    return text


def startup_table(model: ViewModel) -> RenderableType:
    """One progress bar per start-up phase (connect, deploy, checks, ranks), then the attempt's
    milestones so far: how long each took."""
    grid = Table.grid(padding=(0, 2))
    for p in phases(model.state):
        if p.skipped:
            grid.add_row(p.name, Text("no preflight", style="dim"), "")
            continue
        bar = ProgressBar(total=max(p.total, 1), completed=p.done + p.failed, width=40)
        note = f"{p.done}/{p.total}" + (f", {p.failed} failed" if p.failed else "")
        grid.add_row(p.name, bar, Text(note, style="bold red" if p.failed else ""))
    timed = breakdown(model.state)
    if timed is None:
        return grid
    return Group(grid, Text(f"start-up {timed}", style="dim"))


def root_text(model: ViewModel) -> Text | None:
    root = model.state.root_cause()
    if root is None:
        return None
    text = Text("Root cause: ", style=fmt.ROOT_STYLE)
    text.append(fmt.line(describe(root)), style=fmt.ROOT_STYLE)
    text.append(f"  (code {root.code}, by the clock of the {root.clock}; details on the Failure tab)")
    return text


class OverviewView(Vertical):
    DEFAULT_CSS = """
    OverviewView #summary { height: auto; padding: 0 1; }
    OverviewView #startup { height: auto; padding: 0 1; display: none; }
    OverviewView #startup.-shown { display: block; }
    OverviewView #root { height: auto; padding: 0 1; border: heavy red; display: none; }
    OverviewView #root.-shown { display: block; }
    OverviewView NodeTable { height: auto; max-height: 40%; }
    OverviewView #plots { height: 1fr; min-height: 8; }
    """

    def __init__(self, model: ViewModel, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = model
        # The attempt whose start-up is over: its panel (a scan of every node and rank) is done
        # until the next attempt starts up.
        self.started: int | None = None
        self._summary: Text | None = None
        self._summary_lines = -1
        self._startup_shape = -1
        self._plotted = float("-inf")  # time.monotonic() of the plots' last draw
        self._plot_due = False  # new points wait for the next draw

    def compose(self) -> ComposeResult:
        yield Static(id="startup")
        yield Static(id="summary")
        yield Static(id="root")
        yield NodeTable(id="nodes")
        with Horizontal(id="plots"):
            yield SeriesPlot("cluster loss (mean over ranks)", x_label="step", y_label="loss", id="loss-plot")
            yield SeriesPlot(THROUGHPUT_TITLE, x_label="step", y_label=SAMPLES_UNIT, id="throughput-plot")

    def show(self, ch: Changes | None) -> None:
        model = self.model
        att = model.state.attempt
        if att is None or self.started != att.number:
            panel = self.query_one("#startup", Static)
            shown = starting(model.state)
            panel.set_class(shown, "-shown")
            if shown:
                table = startup_table(model)
                # Its height changes only with the number of rows (the timed line comes once).
                shape = len(table.renderables) if isinstance(table, Group) else 0
                panel.update(table, layout=shape != self._startup_shape)
                self._startup_shape = shape
            elif att is not None:
                self.started = att.number
        summary = summary_text(model)
        if summary != self._summary:
            # A layout pass over the whole screen only when the text's height changes (a note
            # came): the elapsed time changes it every second.
            lines = summary.plain.count("\n")
            self.query_one("#summary", Static).update(summary, layout=lines != self._summary_lines)
            self._summary, self._summary_lines = summary, lines
        if ch is None or ch.failure or ch.structure:
            root = root_text(model)
            panel = self.query_one("#root", Static)
            panel.set_class(root is not None, "-shown")
            panel.update(root or "")
        if ch is None or ch.nodes or ch.ranks or ch.checks:
            self.query_one(NodeTable).show(model)
        if ch is None or ch.structure:
            self._plot()
        elif ch.metrics or self._plot_due:
            self._plot_soon()

    def _plot_soon(self) -> None:
        """New points: drawn now if the plots were last drawn PLOT_S ago or the run is over, else
        when that time has passed (a draw of both plots costs ~15 ms of CPU at 200x60, and with
        metrics in every flush it came four times a second)."""
        wait = self._plotted + PLOT_S - time.monotonic()
        if wait <= 0 or self.model.source.done.is_set():
            self._plot()
        elif not self._plot_due:
            self._plot_due = True
            self.set_timer(wait, self._plot_if_due)

    def _plot_if_due(self) -> None:
        if self._plot_due:
            self._plot()

    def _plot(self) -> None:
        self._plot_due = False
        self._plotted = time.monotonic()
        pts = self.model.feed.series.points()
        self.query_one("#loss-plot", SeriesPlot).set_data(pts.loss_steps, pts.loss)
        title = THROUGHPUT_TITLE if pts.unit == SAMPLES_UNIT else "steps per second"
        plot = self.query_one("#throughput-plot", SeriesPlot)
        plot.set_data(pts.throughput_steps, pts.throughput, title=title, y_label=pts.unit)
