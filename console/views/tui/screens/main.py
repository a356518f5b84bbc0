"""The cluster screen: Overview, Devices, Checks and Failure as tabs, the rank filter, the footer."""

from __future__ import annotations

import enum

from mscon.console.engine.events import CheckStatus
from mscon.console.views.tui.feed import Changes
from mscon.console.views.tui.model import ViewModel
from mscon.console.views.tui.screens.checks import ChecksView
from mscon.console.views.tui.screens.devices import DevicesView
from mscon.console.views.tui.screens.failure import FailureView
from mscon.console.views.tui.screens.overview import OverviewView
from mscon.console.views.tui.screens.rank import RankScreen
from mscon.console.views.tui.startup import checks_verdict
from mscon.console.views.tui.widgets.rank_pane import OpenRank
from mscon.console.views.tui.widgets.status_bar import StatusBar
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, TabbedContent, TabPane


class View(enum.StrEnum):
    OVERVIEW = "overview"
    DEVICES = "devices"
    CHECKS = "checks"
    FAILURE = "failure"


class MainScreen(Screen[None]):
    DEFAULT_CSS = """
    MainScreen #filter { dock: bottom; display: none; }
    MainScreen #filter.-shown { display: block; }
    MainScreen TabbedContent { height: 1fr; }
    MainScreen TabPane { padding: 0; }
    """
    BINDINGS = [
        Binding("tab", "cycle(1)", "Next screen", priority=True),
        Binding("shift+tab", "cycle(-1)", "Previous screen", priority=True, show=False),
        Binding("1", "view('overview')", "Overview", show=False),
        Binding("2", "view('devices')", "Devices", show=False),
        Binding("3", "view('checks')", "Checks", show=False),
        Binding("4", "view('failure')", "Failure", show=False),
        Binding("slash", "filter", "Filter ranks"),
        Binding("o", "sort", "Sort table"),
        Binding("O", "sort_reverse", "Reverse the sort", show=False),
        Binding("escape", "back", "Back / clear filter", show=False),
    ]

    def __init__(self, model: ViewModel) -> None:
        super().__init__()
        self.model = model
        self.stale = True
        self.ready = False
        self.checks_shown = False  # the Checks screen comes up by itself once, on a warn or fail

    def on_mount(self) -> None:
        self.ready = True

    def compose(self) -> ComposeResult:
        yield StatusBar()
        with TabbedContent(initial=View.OVERVIEW.value):
            with TabPane("Overview", id=View.OVERVIEW.value):
                yield OverviewView(self.model, id="overview-view")
            with TabPane("Devices", id=View.DEVICES.value):
                yield DevicesView(self.model, id="devices-view")
            with TabPane("Checks", id=View.CHECKS.value):
                yield ChecksView(self.model, id="checks-view")
            with TabPane("Failure", id=View.FAILURE.value):
                yield FailureView(self.model, id="failure-view")
        yield Input(
            placeholder="filter ranks: words, node:NAME, state:STATE, straggler (esc: close)", id="filter"
        )
        yield Footer()

    @property
    def active(self) -> View:
        return View(self.query_one(TabbedContent).active or View.OVERVIEW.value)

    async def show(self, ch: Changes | None) -> None:
        """Update the status line and the visible tab only (hidden tabs catch up when shown)."""
        if not self.ready:
            self.stale = True
            return
        self.query_one(StatusBar).show(self.model)
        verdict = None if self.checks_shown else checks_verdict(self.model.state)
        if verdict is CheckStatus.FAIL:  # the run will not launch: the remedies are what matters now
            self.checks_shown = True
            self.query_one(TabbedContent).active = View.CHECKS.value
            ch = None
        elif verdict is CheckStatus.WARN:  # the run goes on; the remedies are one key away
            self.checks_shown = True
            self.app.notify(
                "preflight warnings: see the Checks screen (3) for the remedies", severity="warning"
            )
        if self.stale:
            ch, self.stale = None, False
        view = self.active
        if view is View.OVERVIEW:
            self.query_one(OverviewView).show(ch)
        elif view is View.DEVICES:
            await self.query_one(DevicesView).show_async(ch)
        elif view is View.CHECKS:
            self.query_one(ChecksView).show(ch)
        else:
            self.query_one(FailureView).show(ch)

    @on(TabbedContent.TabActivated)
    async def _tab(self, event: TabbedContent.TabActivated) -> None:
        await self.show(None)
        if self.active is View.DEVICES:
            self.query_one(DevicesView).focus_main()

    def on_screen_resume(self) -> None:
        self.stale = True

    @on(OpenRank)
    def _open(self, event: OpenRank) -> None:
        event.stop()
        self.app.push_screen(RankScreen(self.model, event.name))

    def action_cycle(self, step: int) -> None:
        views = list(View)
        self.query_one(TabbedContent).active = views[(views.index(self.active) + step) % len(views)].value

    def action_view(self, view: str) -> None:
        self.query_one(TabbedContent).active = View(view).value

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("-shown")
        box.value = self.model.query
        box.focus()

    @on(Input.Changed, "#filter")
    async def _filter_changed(self, event: Input.Changed) -> None:
        self.model.set_query(event.value)
        # Only Devices and the status line show the filter (Devices catches up when shown); no
        # rank changed, so the rows keep the values they have.
        self.query_one(StatusBar).show(self.model)
        if self.active is View.DEVICES and not self.stale:
            self.query_one(DevicesView).refilter()
        elif self.active is View.DEVICES:
            await self.show(None)

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        event.input.remove_class("-shown")
        if self.active is View.DEVICES:
            self.query_one(DevicesView).focus_main()

    async def action_back(self) -> None:
        box = self.query_one("#filter", Input)
        if box.has_class("-shown"):
            box.remove_class("-shown")
            return
        if self.model.query:
            self.model.set_query("")
            await self.show(None)

    def action_sort(self) -> None:
        if self.active is not View.DEVICES:
            self.action_view(View.DEVICES.value)
        self.query_one(DevicesView).sort_next()

    def action_sort_reverse(self) -> None:
        self.query_one(DevicesView).sort_reverse()
