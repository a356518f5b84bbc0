"""A line-API table's row cursor: kept in sight as it moves, redrawn on focus, moved by keys.

The node table and the rank table (``node_table.py``, ``rank_table.py``) draw only the rows in
sight; both keep a ``cursor`` reactive and a ``row_count`` and share this behaviour.
"""

from __future__ import annotations

from textual.scroll_view import ScrollView


class CursorRows(ScrollView):
    """``cursor`` (a reactive of the subclass) over ``row_count`` rows, under one header row."""

    cursor: int

    @property
    def row_count(self) -> int:
        raise NotImplementedError

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

    def action_move(self, step: int) -> None:
        self.cursor = max(0, min(self.row_count - 1, self.cursor + step))

    def action_page(self, step: int) -> None:
        self.action_move(step * max(1, self.size.height - 2))

    def action_edge(self, end: int) -> None:
        self.cursor = max(0, self.row_count - 1) if end else 0
