"""Devices: one pane per rank, or one table row per rank above the pane limit."""

from __future__ import annotations

import asyncio

from mscon.agent.protocol import by_rank
from mscon.console.engine.state_views import RankView
from mscon.console.views.tui.feed import Changes
from mscon.console.views.tui.model import ViewModel
from mscon.console.views.tui.widgets.rank_pane import RankGrid, RankPane
from mscon.console.views.tui.widgets.rank_table import RankTable
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static


class DevicesView(Vertical):
    DEFAULT_CSS = """
    DevicesView #devices-head { height: 1; padding: 0 1; color: $text-muted; }
    DevicesView #grid-scroll { height: 1fr; }
    DevicesView RankTable { height: 1fr; display: none; }
    DevicesView.-table RankTable { display: block; }
    DevicesView.-table #grid-scroll { display: none; }
    """

    def __init__(self, model: ViewModel, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = model
        self._names: list[str] = []
        self._workers: list[RankView] | None = None  # model.workers() as last seen
        self._head: Text | None = None
        self._lock = asyncio.Lock()  # the timer and a tab switch may both ask for a rebuild

    def compose(self) -> ComposeResult:
        yield Static(id="devices-head")
        with VerticalScroll(id="grid-scroll"):
            yield RankGrid(id="grid")
        yield RankTable(id="rank-table")

    @property
    def table_mode(self) -> bool:
        return len(self._names) > self.model.pane_limit

    async def show_async(self, ch: Changes | None) -> None:
        async with self._lock:
            workers = self.model.workers()
            full = ch is None
            # The same list object means the same ranks: no 8,000-name comparison per frame.
            if workers is not self._workers:
                self._workers = workers
                names = [r.name for r in workers]
            else:
                names = self._names
            if names != self._names:
                self._names = names
                self.set_class(self.table_mode, "-table")
                if not self.table_mode:
                    await self.query_one(RankGrid).rebuild(names)
                full = True
            self.show(None if full else ch)

    def show(self, ch: Changes | None) -> None:
        if ch is not None and not ch.ranks and not ch.structure:
            return
        self._update(None if ch is None else ch.ranks)

    def refilter(self) -> None:
        """The query changed, no rank did: the rows are selected again, their values kept."""
        self._update(set(), refilter=True)

    def _update(self, names: set[str] | None, refilter: bool = False) -> None:
        model = self.model
        table = self.query_one(RankTable)
        if self.table_mode:
            table.show(model, names)
        else:
            self.query_one(RankGrid).show(model, None if refilter else names)
        shown = table.row_count if self.table_mode else len(model.visible_workers())
        head = Text(f"{len(self._names)} ranks")
        if model.query:
            head.append(f", {shown} match '{model.query}'")
        if self.table_mode:
            order = "descending" if table.sort_reverse else "ascending"
            head.append(f"; sorted by {table.sort_column.value} ({order}; o: next column, click a header)")
        stragglers = sorted(model.feed.stragglers, key=by_rank)
        if stragglers:
            head.append(f"; stragglers: {', '.join(stragglers[:8])}", style="yellow")
        head.append("; enter: open a rank")
        if head != self._head:  # one fixed line: no layout pass
            self._head = head
            self.query_one("#devices-head", Static).update(head, layout=False)

    def focus_main(self) -> None:
        if self.table_mode:
            self.query_one(RankTable).focus()
        else:
            panes = [p for p in self.query(RankPane) if p.display]
            if panes:
                panes[0].focus()

    def sort_next(self) -> None:
        if self.table_mode:
            self.query_one(RankTable).next_sort()
            self.show(None)

    def sort_reverse(self) -> None:
        if self.table_mode:
            table = self.query_one(RankTable)
            table.sort_by(table.sort_column, not table.sort_reverse)
            self.show(None)
