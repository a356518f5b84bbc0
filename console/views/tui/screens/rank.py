"""Rank: one rank's full log (follow, search, filter) and its loss and step-time plots."""

from __future__ import annotations

from mscon.console.engine.root_cause import describe
from mscon.console.views import plain
from mscon.console.views.tui import fmt
from mscon.console.views.tui.feed import Changes
from mscon.console.views.tui.model import ViewModel
from mscon.console.views.tui.widgets.log_view import LogView
from mscon.console.views.tui.widgets.plots import SeriesPlot
from mscon.console.views.tui.widgets.status_bar import StatusBar
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, Static


def head_text(model: ViewModel, name: str, log: LogView | None) -> Text:
    r = model.state.ranks.get(name)
    text = Text(f"{name}", style="bold")
    if r is None:
        return text.append("  (not in the current attempt)")
    text.append(f" on {fmt.line(r.node)}  ")
    text.append_text(fmt.rank_state(r.state, model.straggler(r)))
    role = model.role(name)
    if role:
        text.append(f"  [{role}]", style=fmt.ROOT_STYLE if role == "root cause" else "dim")
    st = model.feed.step_times.latest(name) or r.step_time_s
    text.append(f"  step {r.last_step if r.last_step is not None else '-'}  loss {fmt.num(r.last_loss)}")
    text.append(f"  {fmt.step_time(st)}/step  {fmt.rate(r.samples_per_s)} samples/s")
    text.append(f"  device mem {plain.size(r.device_memory_bytes, 'n/a')}")
    if r.exited is not None:
        text.append(f"  exit: {r.exited.signal or r.exited.exitcode}", style="" if r.exited.ok else "red")
    root = model.state.root_cause()
    if root is not None and root.name == name:
        text.append(f"\n{fmt.line(describe(root))}", style=fmt.ROOT_STYLE)
    if log is not None:
        count = model.store.count(name)
        text.append(f"\n{count} lines", style="dim")
        if log.filter_rows is not None:
            text.append(f", {len(log.filter_rows)} match '{log.pattern}' (filter on: &)", style="bold")
        elif log.pattern:
            text.append(f", search '{log.pattern}' (n/N: next/previous)", style="dim")
        text.append("  follow on" if log.follow else "  follow off (f)", style="dim")
    return text


class RankScreen(Screen[None]):
    DEFAULT_CSS = """
    RankScreen #rank-head { height: auto; padding: 0 1; background: $boost; }
    RankScreen #rank-body { height: 1fr; }
    RankScreen LogView { width: 1fr; }
    RankScreen #rank-plots { width: 38%; min-width: 30; }
    RankScreen #search { dock: bottom; display: none; }
    RankScreen #search.-shown { display: block; }
    """
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("f", "follow", "Follow"),
        Binding("slash", "search", "Search"),
        Binding("n", "find(True)", "Next match"),
        Binding("N", "find(False)", "Previous match"),
        Binding("ampersand", "filter", "Only matching lines"),
    ]

    def __init__(self, model: ViewModel, name: str) -> None:
        super().__init__()
        self.model = model
        self.rank_name = name
        self.filtering = False
        self.ready = False  # composed and mounted: the flush timer may update it

    def compose(self) -> ComposeResult:
        yield StatusBar()
        yield Static(id="rank-head")
        with Horizontal(id="rank-body"):
            yield LogView(self.model.store, self.rank_name, id="log")
            with Vertical(id="rank-plots"):
                # x: the rank's reported steps in order (epochs may number their steps from 1 again)
                name, x = self.rank_name, "steps reported"
                yield SeriesPlot(f"{name} loss", x_label=x, y_label="loss", id="rank-loss")
                yield SeriesPlot(f"{name} step time", x_label=x, y_label="s/step", id="rank-step-time")
        yield Input(placeholder="search this rank's log (enter: find; esc: close)", id="search")
        yield Footer()

    @property
    def log_view(self) -> LogView:
        return self.query_one(LogView)

    def on_mount(self) -> None:
        self.ready = True
        self.log_view.focus()
        self.show(None)

    def show(self, ch: Changes | None) -> None:
        if not self.ready:
            return
        model = self.model
        self.query_one(StatusBar).show(model)
        name = self.rank_name
        if ch is None or name in ch.lines:
            self.log_view.update_lines()
        if ch is None or name in ch.ranks or ch.failure:
            self.query_one("#rank-head", Static).update(head_text(model, name, self.log_view))
            r = model.state.ranks.get(name)
            if r is not None:
                losses = [loss for _, loss in r.history]
                self.query_one("#rank-loss", SeriesPlot).set_data(range(len(losses)), losses)
            times = model.feed.step_times.history(name)
            self.query_one("#rank-step-time", SeriesPlot).set_data(range(len(times)), times)

    def _refresh_head(self) -> None:
        self.query_one("#rank-head", Static).update(head_text(self.model, self.rank_name, self.log_view))

    def action_back(self) -> None:
        search = self.query_one("#search", Input)
        if search.has_class("-shown"):
            search.remove_class("-shown")
            self.log_view.focus()
            return
        self.app.pop_screen()

    def action_follow(self) -> None:
        self.log_view.follow = not self.log_view.follow
        self._refresh_head()

    def action_search(self) -> None:
        search = self.query_one("#search", Input)
        search.add_class("-shown")
        search.focus()

    @on(Input.Submitted, "#search")
    def _search(self, event: Input.Submitted) -> None:
        event.input.remove_class("-shown")
        self.log_view.set_pattern(event.value)
        if self.filtering:
            self.log_view.set_filter(bool(event.value))
        self.log_view.focus()
        self.log_view.find(True)
        self._refresh_head()

    def action_find(self, forward: bool) -> None:
        self.log_view.find(forward)

    def action_filter(self) -> None:
        if not self.log_view.pattern:
            self.notify("Search first (/), then & shows only the matching lines.")
            return
        self.filtering = not self.filtering
        self.log_view.set_filter(self.filtering)
        self._refresh_head()

    @on(LogView.Filtered)
    @on(LogView.Found)
    def _after_scan(self) -> None:
        self._refresh_head()
