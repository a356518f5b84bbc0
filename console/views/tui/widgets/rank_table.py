"""Devices with many ranks: one row per rank, sortable by any column (header click, ``o``/``O``).

A line-API view (toolong's idea): a flush only marks the rows whose rank changed; the rows on screen
are rebuilt then (the others when they scroll into view), each as one finished line built from
segments (the cells before the last line are kept while their values stay), and the order is sorted
again at most once a second. At 1,024 ranks a flush costs the ~50 rows on screen, not the table.
(Textual's DataTable re-renders every visible cell whenever any cell changes: ~100 ms a frame here.)
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from typing import Any

from mscon.console.engine.events import RankState
from mscon.console.engine.state_views import RankView
from mscon.console.views import plain
from mscon.console.views.log_lines import last_meaningful
from mscon.console.views.tui import fmt
from mscon.console.views.tui.model import ViewModel
from mscon.console.views.tui.widgets.cursor_rows import CursorRows
from mscon.console.views.tui.widgets.rank_pane import OpenRank
from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.strip import Strip

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
    Column.LAST: lambda m, r: last_meaningful(r.tail),
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
        plain.size(r.device_memory_bytes, "n/a"),
        fmt.num(r.cpu_percent, 0),
        Text(fmt.line(last_meaningful(r.tail), 80), style="dim"),
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


def _fit(text: str, width: int) -> str:
    """``text`` cut with an ellipsis or padded to exactly ``width`` cells."""
    if text.isascii() and text.isprintable():
        return text.ljust(width) if len(text) <= width else text[: width - 1] + "…"
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(text, width - 1) + "…"


def _sig(cells: tuple[str | Text, ...]) -> tuple[object, ...]:
    """What a row looks like (Text's own == ignores its style: a rank turning root cause would not show)."""
    return tuple(c if isinstance(c, str) else (c.plain, str(c.style), tuple(c.spans)) for c in cells)


_HEAD = tuple(Column)[:-1]
_TAIL = tuple(Column)[-1:]


def _segments(
    cells: tuple[str | Text, ...], console: Console, columns: tuple[Column, ...] = tuple(Column)
) -> list[Segment]:
    """The row (or some of its columns) as segments, without a Text per cell (what ``_line`` gives)."""
    out: list[Segment] = []
    for col, cell in zip(columns, cells, strict=True):
        width = WIDTHS[col]
        if isinstance(cell, str) and not cell.isprintable():
            cell = Text(cell)
        if isinstance(cell, Text):
            if cell.spans or not cell.plain.isprintable():
                piece = cell.copy()
                piece.truncate(width, overflow="ellipsis", pad=True)
                out.extend(piece.render(console))
                out.append(Segment(" " * _GAP))
                continue
            style = cell.style
            text = cell.plain
        else:
            style, text = "", cell
        out.append(Segment(_fit(text, width), _parse(style) if style else None))
        out.append(Segment(" " * _GAP))
    return out


def _parse(style: str | Style) -> Style:
    return style if isinstance(style, Style) else Style.parse(style)


class RankTable(CursorRows, can_focus=True):
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
        self._rows: dict[str, None] = {}  # the rows: the names the filter selected, in rank order
        self._kept: dict[str, tuple[str | Text, ...]] = {}  # values last taken (stale: _stale), any row
        self._rows_of: list[RankView] | None = None  # model.workers() the rows were last filtered from
        self._rows_query = ""  # and the query they were filtered with
        self._dirty: set[str] = set()  # rows whose rank changed since their values were taken
        self._epoch = 0  # a full refresh's count: values taken before the last one are stale too
        self._taken: dict[str, int] = {}  # name -> the epoch its values were taken in
        self._selected: list[str] = []  # the names the filter selected, in rank order (= _rows)
        self._order: list[str] = []
        self._strips: dict[str, Strip] = {}  # finished lines, valid for _strip_key
        self._prefix: dict[str, tuple[tuple[object, ...], list[Segment]]] = {}  # cells before the last
        self._strip_key: tuple[int, int, Style] | None = None
        self._head: tuple[tuple[int, int, Style, Column, bool], Strip] | None = None
        self._base_style: Style | None = None
        self._last_sort = 0.0
        self._model: ViewModel | None = None
        self._width = sum(WIDTHS.values()) + _GAP * len(WIDTHS)

    # ------------------------------------------------------------ data

    @property
    def row_count(self) -> int:
        return len(self._order)

    def _values(self, name: str) -> tuple[str | Text, ...]:
        """The row's values, recomputed if its rank changed since they were taken."""
        values = self._kept.get(name)
        if (values is None or self._stale(name)) and self._model is not None:
            self._dirty.discard(name)
            self._taken[name] = self._epoch
            r = self._model.state.ranks.get(name)
            if r is not None:
                fresh = row_values(self._model, r)
                if values is None or _sig(fresh) != _sig(values):
                    self._kept[name] = values = fresh
                    self._strips.pop(name, None)
        return values if values is not None else ()

    def _stale(self, name: str) -> bool:
        """The rank changed (or a full refresh came) since its values were taken."""
        return name in self._dirty or self._taken.get(name, -1) < self._epoch

    def get_row_at(self, index: int) -> tuple[str | Text, ...]:
        return self._values(self._order[index])

    def cursor_name(self) -> str | None:
        return self._order[self.cursor] if 0 <= self.cursor < len(self._order) else None

    def _window(self) -> range:
        """Indices into _order of the rows on screen."""
        top = int(self.scroll_offset.y)
        return range(top, min(len(self._order), top + max(0, self.size.height - 1)))

    def show(self, model: ViewModel, names: set[str] | None) -> None:
        """Bring rows up to date: ``names`` changed (None: everything may have; an empty set: no
        rank did, the query may have).

        Only the rows on screen are rebuilt now; the others are marked and rebuilt when shown.
        """
        self._model = model
        self._base_style = None  # taken again once a flush (the background follows the theme)
        workers = model.workers()
        if workers is not self._rows_of:  # a new attempt: nothing taken from the last one holds
            self._kept.clear()
            self._strips.clear()
            self._prefix.clear()
        if names is None:
            self._epoch += 1  # every row's values are to be taken again (when it is in sight)
        # While the ranks (the same list) and the query are those the rows were filtered with, only
        # the ranks that changed can enter or leave the selection: test those, not all 8,000 ranks
        # every frame (without a query, none). Anything else, or a full refresh, filters again.
        same = workers is self._rows_of and model.query == self._rows_query
        if same and model.query:
            ranks = model.state.ranks
            same = names is not None and all(
                model.selected(r) == (n in self._rows)
                for n in names
                if (r := ranks.get(n)) is not None and not r.is_scheduler
            )
        if not same:
            # Lists and C-level builds only: a keystroke may select all 80,000 ranks.
            wanted = [r.name for r in model.select(workers)]
            self._rows_of, self._rows_query = workers, model.query
            if wanted != self._selected:
                # The rows' values and finished lines are kept: a keystroke's refresh draws what
                # it selects from them, taking again only what changed (names, _epoch).
                keep = self.cursor_name()
                self._selected = wanted
                self._rows = dict.fromkeys(wanted)
                if names:
                    self._dirty |= names
                self._order = []
                self.apply_sort(keep, wanted)
                return
        if names is not None:
            self._dirty |= names & self._rows.keys()
            if not self._dirty:
                return
        resort = self.sort_column is not Column.RANK and (
            names is None or time.monotonic() - self._last_sort >= _RESORT_S
        )
        if resort and self.apply_sort():
            return  # the order changed: everything on screen is repainted anyway
        order = self._order
        lines = [
            i
            for i in self._window()
            if self._stale(order[i]) and self._kept.get(order[i]) is not self._values(order[i])
        ]
        if lines:
            top = int(self.scroll_offset.y)
            first, last = lines[0] - top + 1, lines[-1] - top + 1
            self.refresh(Region(0, first, self.size.width, last - first + 1))

    def apply_sort(self, keep: str | None = None, fresh: list[str] | None = None) -> bool:
        """Sort the rows by the current column; True if the order changed. ``fresh``: the rows'
        names just taken from the current workers, in rank order."""
        model = self._model
        if model is None:
            return False
        keep = keep or self.cursor_name()
        self._last_sort = time.monotonic()
        ranks = model.state.ranks
        key = SORT_KEY[self.sort_column]
        names = fresh if fresh is not None else [n for n in self._rows if n in ranks]
        if self.sort_column is Column.RANK:
            # The rows are taken from model.workers(), in rank order already: no 80,000-key sort.
            if self.sort_reverse:
                names = names[::-1]
        else:
            names = sorted(names, key=lambda n: key(model, ranks[n]), reverse=self.sort_reverse)
        changed = names != self._order
        if changed:
            self._order = names
            self.refresh()
        self.virtual_size = Size(self._width, len(self._order) + 1)
        at = self._index(keep)
        if at is not None:
            self.cursor = at
        self.cursor = min(self.cursor, max(0, len(self._order) - 1))
        return changed

    def _index(self, name: str | None) -> int | None:
        """Where ``name`` is in the order (one scan: asked only when the order is made again)."""
        if name is None:
            return None
        try:
            return self._order.index(name)
        except ValueError:
            return None

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

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._base_style = None
        self._strips.clear()
        self._prefix.clear()
        self._head = None

    def _style(self) -> Style:
        if self._base_style is None:
            self._base_style = self.rich_style
        return self._base_style

    def _build(
        self, name: str, values: tuple[str | Text, ...], scroll_x: int, width: int, base: Style
    ) -> Strip:
        """One finished row. Only the last-line cell changes with every batch of lines: the cells
        before it are kept as styled segments while their values stay the same."""
        cached = self._prefix.get(name)
        sig = _sig(values[:-1])
        if cached is None or cached[0] != sig:
            segs = Segment.apply_style(_segments(values[:-1], self.app.console, _HEAD), base)
            cached = self._prefix[name] = (sig, list(segs))
        segs = list(cached[1])
        segs.extend(Segment.apply_style(_segments(values[-1:], self.app.console, _TAIL), base))
        if scroll_x == 0 and width >= self._width:
            if width > self._width:
                segs.append(Segment(" " * (width - self._width), base))
            return Strip(segs, width)
        return Strip(segs, self._width).crop_extend(scroll_x, scroll_x + width, base)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self._style()
        if y == 0:
            hkey = (scroll_x, width, base, self.sort_column, self.sort_reverse)
            if self._head is None or self._head[0] != hkey:
                head = Text(no_wrap=True)
                for col in Column:
                    mark = ("▼" if self.sort_reverse else "▲") if col is self.sort_column else ""
                    head.append(f"{col.value}{mark}"[: WIDTHS[col]].ljust(WIDTHS[col]) + " " * _GAP)
                style = self.get_component_rich_style("ranktable--header")
                strip = Strip(head.render(self.app.console), head.cell_len)
                self._head = (hkey, strip.crop_extend(scroll_x, scroll_x + width, style).apply_style(style))
            return self._head[1]
        row = scroll_y + y - 1
        if row >= len(self._order):
            return Strip.blank(width, base)
        key = (scroll_x, width, base)
        if key != self._strip_key:
            self._strips.clear()
            self._prefix.clear()
            self._strip_key = key
        name = self._order[row]
        values = self._values(name)
        if row == self.cursor and self.has_focus:
            text = _line(values)
            strip = Strip(text.render(self.app.console), text.cell_len).crop_extend(
                scroll_x, scroll_x + width, base
            )
            return strip.apply_style(self.get_component_rich_style("ranktable--cursor")).apply_style(base)
        strip = self._strips.get(name)
        if strip is None:
            strip = self._strips[name] = self._build(name, values, scroll_x, width, base)
        return strip

    # ------------------------------------------------------------ keys and mouse

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
