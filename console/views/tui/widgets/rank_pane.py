"""Devices with few ranks: one pane per rank (state, numbers, a loss sparkline, the last line)."""

from __future__ import annotations

from mscon.console.engine.events import RankState
from mscon.console.engine.state_views import RankView
from mscon.console.views import plain
from mscon.console.views.log_lines import last_meaningful
from mscon.console.views.tui import fmt
from mscon.console.views.tui.model import ViewModel
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Grid
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Label, Sparkline

SPARK_POINTS = 60


class OpenRank(Message):
    """Drill down into one rank."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


def pane_classes(model: ViewModel, r: RankView) -> set[str]:
    classes = set()
    if r.state in (RankState.FAILED, RankState.LOST):
        classes.add("-failed")
    elif r.state is RankState.HUNG:
        classes.add("-hung")
    elif model.straggler(r):
        classes.add("-straggler")
    if model.role(r.name) == "root cause":
        classes.add("-root")
    return classes


class RankPane(Widget, can_focus=True):
    DEFAULT_CSS = """
    RankPane { height: 7; border: round $primary-darken-2; padding: 0 1; }
    RankPane:focus { border: double $accent; }
    RankPane.-failed { border: round red; }
    RankPane.-hung { border: round magenta; }
    RankPane.-straggler { border: round yellow; }
    RankPane.-root { border: heavy red; }
    RankPane Label { width: 1fr; height: 1; }
    RankPane Sparkline { height: 1; }
    """
    ALL_CLASSES = ("-failed", "-hung", "-straggler", "-root")

    def __init__(self, name: str) -> None:
        super().__init__(id=f"pane-{name}")
        self.rank_name = name

    def compose(self) -> ComposeResult:
        yield Label(id="head")
        yield Label(id="nums")
        yield Label(id="res")
        yield Sparkline([], id="spark")
        yield Label(id="last")

    def show(self, model: ViewModel, r: RankView) -> None:
        straggler = model.straggler(r)
        head = Text(f"{r.name}", style="bold")
        head.append(f" · {fmt.line(r.node)}  ")
        head.append_text(fmt.rank_state(r.state, straggler))
        role = model.role(r.name)
        if role:
            head.append(f"  [{role}]", style=fmt.ROOT_STYLE if role == "root cause" else "dim")
        st = model.feed.step_times.latest(r.name) or r.step_time_s
        nums = Text(f"step {r.last_step if r.last_step is not None else '-'}  loss {fmt.num(r.last_loss)}  ")
        nums.append(f"{fmt.step_time(st)}/step", style=fmt.STRAGGLER_STYLE if straggler else "")
        nums.append(f"  {fmt.rate(r.samples_per_s)} samples/s")
        res = fmt.device_text(r)
        res.append(f"  cpu {fmt.num(r.cpu_percent, 0)}%  rss {plain.size(r.rss_bytes)}")
        if r.exited is not None and not r.exited.ok:
            res.append(f"  {r.exited.signal or f'exit {r.exited.exitcode}'}", style=fmt.ROOT_STYLE)
        self.query_one("#head", Label).update(head)
        self.query_one("#nums", Label).update(nums)
        self.query_one("#res", Label).update(res)
        losses = [loss for _, loss in list(r.history)[-SPARK_POINTS:]]
        spark = self.query_one("#spark", Sparkline)
        if spark.data != losses:
            spark.data = losses
        self.query_one("#last", Label).update(Text(fmt.line(last_meaningful(r.tail)), style="dim"))
        want = pane_classes(model, r)
        for c in self.ALL_CLASSES:
            self.set_class(c in want, c)

    def on_click(self, event: events.Click) -> None:
        self.post_message(OpenRank(self.rank_name))

    def key_enter(self) -> None:
        self.post_message(OpenRank(self.rank_name))


class RankGrid(Grid):
    DEFAULT_CSS = """
    RankGrid { grid-size: 2; grid-gutter: 0 1; height: auto; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.names: list[str] = []

    async def rebuild(self, names: list[str]) -> None:
        self.names = list(names)
        await self.remove_children()
        await self.mount_all([RankPane(n) for n in names])
        self.on_resize()

    def on_resize(self, event: events.Resize | None = None) -> None:
        width = self.size.width or 120
        self.styles.grid_size_columns = max(1, min(4, width // 48))

    def show(self, model: ViewModel, names: set[str] | None) -> None:
        ranks = model.state.ranks
        for pane in self.query(RankPane):
            r = ranks.get(pane.rank_name)
            if r is None:
                continue
            visible = model.selected(r)
            pane.display = visible
            if visible and (names is None or pane.rank_name in names):
                pane.show(model, r)
