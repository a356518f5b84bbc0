"""Devices with many ranks: one row per rank, sortable by any column (header click, ``o``/``O``).

A line-API view (toolong's idea): only the rows on screen are rendered, each as one line cached by
its values, so a flush at 1,024 ranks re-renders the few rows whose numbers changed, not the table.
(Textual's DataTable re-renders every visible cell whenever any cell changes: ~100 ms a frame here.)
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ...events import RankState
from ...state import RankView
from .. import fmt
from ..model import ViewModel
from .rank_pane import OpenRank

_STATE_ORDER = {s: i for i, s in enumerate(RankState)}
_RESORT_S = 1.0


class Column(enum.StrEnum):
    RANK = "rank"
    NODE = "node"
    STATE = "state"
    STEP = "step"
    LOSS = "loss"
    STEP_TIME = "step time"
    SAMPLES = "samples/s"
    MEMORY = "device mem"
    CPU = "cpu %"
    LAST = "last line"


def _step_time(model: ViewModel, r: RankView) -> float | None:
    return model.feed.step_times.latest(r.name) or r.step_time_s


def _num(v: float | None) -> float:
    return -math.inf if v is None else v


SORT_KEY: dict[Column, Callable[[ViewModel, RankView], Any]] = {
    Column.RANK: lambda m, r: r.rank,
    Column.NODE: lambda m, r: (r.node, r.rank),
    Column.STATE: lambda m, r: (_STATE_ORDER[r.state], not m.straggler(r), r.rank),
    Column.STEP: lambda m, r: _num(r.last_step),
    Column.LOSS: lambda m, r: _num(r.last_loss),
    Column.STEP_TIME: lambda m, r: _num(_step_time(m, r)),
    Column.SAMPLES: lambda m, r: _num(r.samples_per_s),
    Column.MEMORY: lambda m, r: _num(r.device_memory_bytes),
    Column.CPU: lambda m, r: _num(r.cpu_percent),
    Column.LAST: lambda m, r: r.tail[-1] if r.tail else "",
}


def row_values(model: ViewModel, r: RankView) -> tuple[str | Text, ...]:
    straggler = model.straggler(r)
    role = model.role(r.name)
    name = Text(r.name, style=fmt.ROOT_STYLE if role == "root cause" else "")
    return (
        name,
        fmt.line(r.node),
        fmt.rank_state(r.state, straggler),
        "-" if r.last_step is None else str(r.last_step),
        fmt.num(r.last_loss),
        Text(fmt.step_time(_step_time(model, r)), style=fmt.STRAGGLER_STYLE if straggler else ""),
        fmt.rate(r.samples_per_s),
        fmt.size(r.device_memory_bytes, "n/a"),
        fmt.num(r.cpu_percent, 0),
        Text(fmt.line(r.tail[-1], 80) if r.tail else "", style="dim"),
    )


WIDTHS: dict[Column, int] = {
    Column.RANK: 6,
    Column.NODE: 12,
    Column.STATE: 24,
    Column.STEP: 7,
    Column.LOSS: 8,
    Column.STEP_TIME: 10,
    Column.SAMPLES: 10,
    Column.MEMORY: 11,
    Column.CPU: 6,
    Column.LAST: 80,
}
_GAP = 1


def _line(cells: tuple[str | Text, ...], style: str = "") -> Text:
    text = Text(no_wrap=True, overflow="crop", style=style)
    for col, cell in zip(Column, cells, strict=True):
        piece = cell.copy() if isinstance(cell, Text) else Text(cell)
        piece.truncate(WIDTHS[col], overflow="ellipsis", pad=True)
        text.append_text(piece)
        text.append(" " * _GAP)
    return text


class RankTable(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    RankTable { background: $surface; }
    RankTable > .ranktable--header { text-style: bold; background: $panel; }
    RankTable > .ranktable--cursor { background: $accent 40%; }
    """
    COMPONENT_CLASSES = {"ranktable--header", "ranktable--cursor"}
    BINDINGS = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First rank", show=False),
        Binding("end", "edge(1)", "Last rank", show=False),
        Binding("enter", "open", "Open rank", show=False),
    ]
    cursor = reactive(0)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_column = Column.RANK
        self.sort_reverse = False
        self._rows: dict[str, tuple[str | Text, ...]] = {}
        self._order: list[str] = []
        self._strips: dict[str, Strip] = {}
        self._last_sort = 0.0
        self._model: ViewModel | None = None
        self._width = sum(WIDTHS.values()) + _GAP * len(WIDTHS)

    # ------------------------------------------------------------ data

    @property
    def row_count(self) -> int:
        return len(self._order)

    def get_row_at(self, index: int) -> tuple[str | Text, ...]:
        return self._rows[self._order[index]]

    def cursor_name(self) -> str | None:
        return self._order[self.cursor] if 0 <= self.cursor < len(self._order) else None

    def show(self, model: ViewModel, names: set[str] | None) -> None:
        """Bring rows up to date: ``names`` changed (None: everything may have)."""
        self._model = model
        ranks = model.state.ranks
        wanted = [r.name for r in model.visible_workers()]
        if set(wanted) != set(self._rows):
            keep = self.cursor_name()
            self._rows = {n: row_values(model, ranks[n]) for n in wanted}
            self._strips.clear()
            self._order = []
            self.apply_sort(keep)
            return
        changed = False
        for name in wanted if names is None else names & self._rows.keys():
            values = row_values(model, ranks[name])
            if values != self._rows[name]:
                self._rows[name] = values
                self._strips.pop(name, None)
                changed = True
                self._refresh_name(name)
        if (
            changed
            and self.sort_column is not Column.RANK
            and time.monotonic() - self._last_sort >= _RESORT_S
        ):
            self.apply_sort()

    def apply_sort(self, keep: str | None = None) -> None:
        model = self._model
        if model is None:
            return
        keep = keep or self.cursor_name()
        self._last_sort = time.monotonic()
        ranks = model.state.ranks
        key = SORT_KEY[self.sort_column]
        names = [n for n in self._rows if n in ranks]
        names.sort(key=lambda n: key(model, ranks[n]), reverse=self.sort_reverse)
        if names != self._order:
            self._order = names
            self.refresh()
        self.virtual_size = Size(self._width, len(self._order) + 1)
        if keep in self._rows:
            self.cursor = self._order.index(keep)
        self.cursor = min(self.cursor, max(0, len(self._order) - 1))

    def sort_by(self, column: Column, reverse: bool | None = None) -> None:
        if reverse is None:
            reverse = not self.sort_reverse if column is self.sort_column else False
        self.sort_column, self.sort_reverse = column, reverse
        self._order = []
        self.apply_sort()
        self.refresh()

    def next_sort(self) -> None:
        cols = list(Column)
        self.sort_by(cols[(cols.index(self.sort_column) + 1) % len(cols)], False)

    # ------------------------------------------------------------ rendering

    def _refresh_name(self, name: str) -> None:
        try:
            row = self._order.index(name) + 1
        except ValueError:
            return
        top = self.scroll_offset.y
        if top <= row - 1 < top + self.size.height:
            self.refresh_line(row - top)

    def refresh_line(self, y: int) -> None:
        from textual.geometry import Region

        self.refresh(Region(0, y, self.size.width, 1))

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            head = Text(no_wrap=True)
            for col in Column:
                mark = ("▼" if self.sort_reverse else "▲") if col is self.sort_column else ""
                head.append(f"{col.value}{mark}"[: WIDTHS[col]].ljust(WIDTHS[col]) + " " * _GAP)
            style = self.get_component_rich_style("ranktable--header")
            strip = Strip(head.render(self.app.console), head.cell_len)
            return strip.crop_extend(scroll_x, scroll_x + width, style).apply_style(style)
        row = scroll_y + y - 1
        if row >= len(self._order):
            return Strip.blank(width, self.rich_style)
        name = self._order[row]
        strip = self._strips.get(name)
        if strip is None:
            text = _line(self._rows[name])
            strip = self._strips[name] = Strip(text.render(self.app.console), text.cell_len)
        strip = strip.crop_extend(scroll_x, scroll_x + width, self.rich_style)
        if row == self.cursor and self.has_focus:
            strip = strip.apply_style(self.get_component_rich_style("ranktable--cursor"))
        return strip.apply_style(self.rich_style)

    def watch_cursor(self, old: int, new: int) -> None:
        self.refresh()
        top = self.scroll_offset.y
        rows = max(1, self.size.height - 1)
        if new < top:
            self.scroll_to(y=new, animate=False)
        elif new >= top + rows:
            self.scroll_to(y=new - rows + 1, animate=False)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # ------------------------------------------------------------ keys and mouse

    def action_move(self, step: int) -> None:
        self.cursor = max(0, min(len(self._order) - 1, self.cursor + step))

    def action_page(self, step: int) -> None:
        self.action_move(step * max(1, self.size.height - 2))

    def action_edge(self, end: int) -> None:
        self.cursor = max(0, len(self._order) - 1) if end else 0

    def action_open(self) -> None:
        name = self.cursor_name()
        if name is not None:
            self.post_message(OpenRank(name))

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            x = event.x + self.scroll_offset.x
            for col in Column:
                if x < WIDTHS[col] + _GAP:
                    self.sort_by(col)
                    return
                x -= WIDTHS[col] + _GAP
            return
        row = self.scroll_offset.y + event.y - 1
        if 0 <= row < len(self._order):
            self.cursor = row
            self.post_message(OpenRank(self._order[row]))
