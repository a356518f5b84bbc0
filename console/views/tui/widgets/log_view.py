"""A rank's full log, rendered lazily: only the rows on screen are read from the LineStore and styled.

Follow (stick to the end as lines arrive), search (``find``: the next or previous matching line),
and a filter that shows only matching lines (``set_filter``). Tracebacks and error lines are
highlighted; matches are marked. Long scans run in a thread and report back with messages.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

from mscon.console.views.tui import fmt
from mscon.console.views.tui.linestore import LineStore
from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.worker import get_current_worker

_TRACEBACK = re.compile(
    r"^(Traceback \(most recent call last\)|\s+File \".*\", line \d+|"
    r"([A-Za-z_][\w.]*)?(Error|Exception|Interrupt|Exit)(:|\b)|\s*raise\b)"
)
_ERROR = re.compile(r"\[ERROR\]|\bERROR\b|\bFATAL\b|\bCRITICAL\b")
_WARNING = re.compile(r"\[WARNING\]|\bWARNING\b")
_SEPARATOR = "──── attempt "


def line_style(text: str) -> str | None:
    """The style of a whole log line: tracebacks and errors red, warnings yellow."""
    if _TRACEBACK.match(text) or _ERROR.search(text):
        return "red"
    if _WARNING.search(text):
        return "yellow"
    if text.startswith(_SEPARATOR):
        return "bold cyan"
    return None


class LogView(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    LogView { background: $surface; }
    """
    BINDINGS = [
        Binding("up,k", "line_up", "Up", show=False),
        Binding("down,j", "line_down", "Down", show=False),
        Binding("pageup", "page_up_", "Page up", show=False),
        Binding("pagedown,space", "page_down_", "Page down", show=False),
        Binding("home,g", "top", "Top", show=False),
        Binding("end,G", "bottom", "End (follow)", show=False),
    ]

    follow: reactive[bool] = reactive(True)

    class Found(Message):
        """A search finished: the index of the matching line, or None."""

        def __init__(self, index: int | None, pattern: str) -> None:
            super().__init__()
            self.index = index
            self.pattern = pattern

    class Filtered(Message):
        def __init__(self, rows: list[int], scanned: int, pattern: str) -> None:
            super().__init__()
            self.rows = rows
            self.scanned = scanned
            self.pattern = pattern

    def __init__(self, store: LineStore, rank: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.store = store
        self.rank = rank
        self.pattern: str = ""
        self._regex: re.Pattern[str] | None = None
        self.filter_rows: list[int] | None = None  # store indices shown while filtering
        self._filter_scanned = 0
        self.current: int | None = None  # store index of the current match
        self._strips: LRUCache[int, Strip] = LRUCache(1024)
        self._width = 0

    # ------------------------------------------------------------ size and follow

    @property
    def line_count(self) -> int:
        return len(self.filter_rows) if self.filter_rows is not None else self.store.count(self.rank)

    def on_mount(self) -> None:
        self.update_lines()

    def on_resize(self) -> None:
        # Mounted with no height yet (a rank opened after its last line came): follow once laid out.
        self.update_lines()

    def update_lines(self) -> None:
        """New lines arrived (or the filter changed): grow, and stick to the end when following."""
        if self.filter_rows is not None and self._regex is not None:
            total = self.store.count(self.rank)
            if self._filter_scanned < total:
                self.filter_rows.extend(
                    i for i, t in self.store.lines(self.rank, self._filter_scanned, total) if self._match(t)
                )
                self._filter_scanned = total
        count = self.line_count
        self.virtual_size = Size(max(self._width, self.size.width), count)
        if self.follow:  # max_scroll_y: the rows under a horizontal scrollbar are not shown
            self.scroll_to(y=self.max_scroll_y, animate=False, immediate=True)
        self.refresh()

    def watch_follow(self, follow: bool) -> None:
        if follow:
            self.update_lines()

    # ------------------------------------------------------------ rendering

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.size.width
        rich_style = self.rich_style
        if row >= self.line_count:
            return Strip.blank(width, rich_style)
        index = self.filter_rows[row] if self.filter_rows is not None else row
        strip = self._strips.get(index)
        if strip is None:
            strip = self._strip(index)
            self._strips[index] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, rich_style).apply_offsets(scroll_x, row)

    def _strip(self, index: int) -> Strip:
        raw = self.store.line(self.rank, index)
        body = fmt.line(raw)
        text = Text(f"{index + 1:>7} ", style="dim", no_wrap=True)
        start = len(text)
        text.append(body, style=line_style(body) or "")
        if self._regex is not None:
            for m in self._regex.finditer(body):
                style = "bold black on yellow" if index == self.current else "reverse"
                text.stylize(style, start + m.start(), start + m.end())
        text.stylize(self.rich_style)
        if text.cell_len > self._width:
            self._width = min(text.cell_len, 4000)
            self.virtual_size = Size(max(self._width, self.size.width), self.line_count)
        return Strip(text.render(self.app.console), text.cell_len)

    def _match(self, text: str) -> bool:
        return self._regex is not None and self._regex.search(fmt.line(text)) is not None

    def _restyle(self) -> None:
        self._strips.clear()
        self.refresh()

    # ------------------------------------------------------------ search and filter

    def set_pattern(self, pattern: str) -> None:
        self.pattern = pattern
        self._regex = re.compile(re.escape(pattern), re.IGNORECASE) if pattern else None
        self.current = None
        self._restyle()

    def find(self, forward: bool = True) -> None:
        """Look for the next (or previous) line matching the pattern from the current one."""
        if self._regex is None:
            return
        if self.current is not None:
            start = self.current
        else:
            top = self.scroll_offset.y
            start = self._index_of_row(top) - (1 if forward else -1)
        self.store.flush()
        self._scan(self.pattern, start, forward, self.store.count(self.rank))

    @work(thread=True, exclusive=True, group="log-search")
    def _scan(self, pattern: str, start: int, forward: bool, total: int) -> None:
        worker = get_current_worker()
        rows: Iterator[int] = iter(range(start + 1, total)) if forward else iter(range(start - 1, -1, -1))
        regex = re.compile(re.escape(pattern), re.IGNORECASE)
        found = None
        for n, i in enumerate(rows):
            if n % 4096 == 0 and worker.is_cancelled:
                return
            if regex.search(fmt.line(self.store.line(self.rank, i))):
                found = i
                break
        self.post_message(self.Found(found, pattern))

    @on(Found)
    def _found(self, event: Found) -> None:
        if event.pattern != self.pattern or event.index is None:
            return
        self.current = event.index
        self.follow = False
        self._restyle()
        row = self._row_of_index(event.index)
        if row is not None:
            self.scroll_to(y=max(0, row - self.size.height // 2), animate=False, immediate=True)

    def set_filter(self, on: bool) -> None:
        """Show only the lines matching the pattern (on), or every line (off)."""
        if not on or self._regex is None:
            self.filter_rows = None
            self._filter_scanned = 0
            self._after_filter()
            return
        self.store.flush()
        total = self.store.count(self.rank)
        self.filter_rows = []  # lines after ``total`` are added as they come; the thread does the rest
        self._filter_scanned = total
        self._collect(self.pattern, total)
        self._after_filter()

    @work(thread=True, exclusive=True, group="log-filter")
    def _collect(self, pattern: str, total: int) -> None:
        worker = get_current_worker()
        regex = re.compile(re.escape(pattern), re.IGNORECASE)
        rows = []
        for i, text in self.store.lines(self.rank, 0, total):
            if i % 4096 == 0 and worker.is_cancelled:
                return
            if regex.search(fmt.line(text)):
                rows.append(i)
        self.post_message(self.Filtered(rows, total, pattern))

    @on(Filtered)
    def _filtered(self, event: Filtered) -> None:
        if event.pattern != self.pattern or self.filter_rows is None:
            return
        self.filter_rows = event.rows + self.filter_rows
        self._after_filter()

    def _after_filter(self) -> None:
        self._strips.clear()
        self.scroll_to(y=0, animate=False, immediate=True)
        self.update_lines()

    def _index_of_row(self, row: int) -> int:
        if self.filter_rows is None:
            return row
        return self.filter_rows[row] if row < len(self.filter_rows) else self.store.count(self.rank)

    def _row_of_index(self, index: int) -> int | None:
        if self.filter_rows is None:
            return index
        pos = bisect.bisect_left(self.filter_rows, index)
        return pos if pos < len(self.filter_rows) and self.filter_rows[pos] == index else None

    # ------------------------------------------------------------ moving (leaves follow mode)

    def _move(self, dy: int) -> None:
        self.follow = False
        self.scroll_to(y=max(0, self.scroll_offset.y + dy), animate=False, immediate=True)

    def action_line_up(self) -> None:
        self._move(-1)

    def action_line_down(self) -> None:
        self._move(1)

    def action_page_up_(self) -> None:
        self._move(-max(1, self.size.height - 1))

    def action_page_down_(self) -> None:
        self._move(max(1, self.size.height - 1))

    def action_top(self) -> None:
        self.follow = False
        self.scroll_to(y=0, animate=False, immediate=True)

    def action_bottom(self) -> None:
        if self.follow:  # no change for the watcher to act on: go to the end all the same
            self.update_lines()
        self.follow = True

    def on_mouse_scroll_up(self) -> None:
        self.follow = False
