"""Overview's table: one row per node (state, preflight summary, ranks, CPU and memory).

A line-API view, as the rank table: a row is computed only when it is on screen, from that node's
own ranks (``ClusterState.workers_on``) and checks (``checks_on``), so a refresh costs the ~20
rows in sight, not 10,000 nodes and their 80,000 ranks. (Textual's DataTable holds every row's
cells: a refresh that summed every rank and compared every cell took most of a second at 10,000
nodes.) Column widths are those of the header and the widest cell seen so far, as DataTable's.
"""

from __future__ import annotations

from collections import Counter

from mscon.console.engine.events import CheckStatus
from mscon.console.views import plain
from mscon.console.views.tui import fmt
from mscon.console.views.tui.model import ViewModel
from mscon.console.views.tui.widgets.cursor_rows import CursorRows
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.strip import Strip

COLUMNS = ("node", "host", "state", "checks", "ranks up", "failed", "CPU", "memory")
_PAD = 1  # blank cells each side of a cell (DataTable's cell padding)

Cells = tuple[Text, ...]


def checks_summary(counts: Counter[CheckStatus] | None) -> Text:
    if not counts:
        return Text("-", style="dim")
    text = Text()
    for status, style in ((CheckStatus.FAIL, "bold red"), (CheckStatus.WARN, "yellow"), (CheckStatus.OK, "")):
        if counts[status]:
            text.append(f"{counts[status]} {status.value} ", style=style)
    return text


def node_row(model: ViewModel, name: str) -> Cells:
    """One node's cells, from its own ranks and checks only."""
    st = model.state
    view = st.nodes.get(name)
    up = failed = 0
    cpu = 0.0
    rss = 0
    for r in st.workers_on(name):
        if r.state in fmt.LIVE:
            up += 1
        if r.state in fmt.FAILED:
            failed += 1
        cpu += r.cpu_percent or 0.0
        rss += r.rss_bytes or 0
    checks = Counter(c.status for c in st.checks_on(name))
    return (
        Text(fmt.line(name)),
        Text(fmt.line(view.host) if view and view.host else "-"),
        fmt.node_state(view.state) if view else Text("-"),
        checks_summary(checks),
        Text(str(up)),
        Text(str(failed), style=fmt.ROOT_STYLE if failed else ""),
        Text(f"{cpu:.0f}%" if cpu else "-"),
        Text(plain.size(rss) if rss else "-"),
    )


def _sig(cells: Cells) -> tuple[object, ...]:
    """What a row looks like (Text's own == ignores its style)."""
    return tuple((c.plain, str(c.style), tuple(c.spans)) for c in cells)


class NodeTable(CursorRows, can_focus=True):
    DEFAULT_CSS = """
    NodeTable { background: $surface; color: $foreground; height: auto; }
    NodeTable > .nodetable--header { text-style: bold; background: $panel; color: $foreground; }
    NodeTable > .nodetable--even-row { background: $surface-lighten-1 50%; }
    NodeTable:dark > .nodetable--even-row { background: $surface-darken-1 40%; }
    NodeTable > .nodetable--cursor { background: $block-cursor-background; color: $block-cursor-foreground; }
    """
    COMPONENT_CLASSES = {"nodetable--header", "nodetable--even-row", "nodetable--cursor"}
    BINDINGS = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First node", show=False),
        Binding("end", "edge(1)", "Last node", show=False),
    ]
    cursor = reactive(0)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._model: ViewModel | None = None
        self._names: list[str] = []
        self._nodes_of: object = None  # state.nodes the names were taken from
        self._widths = [cell_len(c) for c in COLUMNS]
        self._cells: dict[str, Cells] = {}  # each row's cells as last computed
        self._shown: dict[str, tuple[object, ...]] = {}  # rows on screen: what they were drawn with
        self._strips: dict[str, tuple[tuple[object, ...], Strip]] = {}
        self._strip_key: tuple[int, int, Style] | None = None

    @property
    def row_count(self) -> int:
        return len(self._names)

    def show(self, model: ViewModel) -> None:
        """Bring the rows in sight up to date (the others are computed when they scroll in)."""
        self._model = model
        nodes = model.state.nodes
        if nodes is not self._nodes_of or len(nodes) != len(self._names):
            self._nodes_of, self._names = nodes, list(nodes)
            for i, col in ((0, "node"), (1, "host")):
                widest = max((cell_len(fmt.line(v)) for v in self._column(col)), default=0)
                self._widths[i] = max(self._widths[i], widest)
            self._cells.clear()
            self._shown.clear()
            self._strips.clear()
            self.virtual_size = Size(self._total_width(), len(self._names) + 1)
            self.cursor = min(self.cursor, max(0, len(self._names) - 1))
            self.refresh()
            return
        changed = [i for i in self._window() if self._row(self._names[i]) != self._shown.get(self._names[i])]
        if changed:
            top = int(self.scroll_offset.y)
            first, last = changed[0] - top + 1, changed[-1] - top + 1
            self.refresh(Region(0, first, self.size.width, last - first + 1))

    def _column(self, col: str) -> list[str]:
        st = self._model.state if self._model is not None else None
        if st is None:
            return []
        if col == "node":
            return self._names
        return [v.host for n in self._names if (v := st.nodes.get(n)) is not None and v.host]

    def _total_width(self) -> int:
        return sum(w + 2 * _PAD for w in self._widths)

    def _window(self) -> range:
        top = int(self.scroll_offset.y)
        return range(top, min(len(self._names), top + max(0, self.size.height - 1)))

    def _row(self, name: str) -> tuple[object, ...]:
        """The row's look now; a cell wider than its column widens the column (all rows redrawn)."""
        assert self._model is not None
        cells = node_row(self._model, name)
        grown = False
        for i, c in enumerate(cells):
            if c.cell_len > self._widths[i]:
                self._widths[i], grown = c.cell_len, True
        if grown:
            self._strips.clear()
            self._shown.clear()
            self.virtual_size = Size(self._total_width(), len(self._names) + 1)
            self.refresh()
        self._cells[name] = cells
        return _sig(cells)

    def _segments(self, cells: Cells) -> list[Segment]:
        console = self.app.console
        out: list[Segment] = []
        for cell, width in zip(cells, self._widths, strict=True):
            piece = cell.copy()
            piece.truncate(width, overflow="ellipsis", pad=True)
            out.append(Segment(" " * _PAD))
            # Text.render gives the spans' styles only: the cell's own goes beneath them.
            segs = piece.render(console)
            if cell.style:
                style = cell.style if isinstance(cell.style, Style) else Style.parse(cell.style)
                segs = Segment.apply_style(segs, style)
            out.extend(segs)
            out.append(Segment(" " * _PAD))
        return out

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self.rich_style
        total = self._total_width()
        if y == 0:
            style = self.get_component_rich_style("nodetable--header")
            head = Strip(self._segments(tuple(Text(c) for c in COLUMNS)), total)
            return head.crop_extend(scroll_x, scroll_x + width, style).apply_style(style)
        row = scroll_y + y - 1
        if row >= len(self._names) or self._model is None:
            return Strip.blank(width, base)
        key = (scroll_x, width, base)
        if key != self._strip_key:
            self._strips.clear()
            self._strip_key = key
        name = self._names[row]
        sig = self._row(name)
        self._shown[name] = sig
        style = base
        if row % 2:
            style = base + self.get_component_rich_style("nodetable--even-row")
        if row == self.cursor and self.has_focus:
            style = base + self.get_component_rich_style("nodetable--cursor")
        else:
            cached = self._strips.get(name)
            if cached is not None and cached[0] == (sig, row % 2):
                return cached[1]
        strip = Strip(Segment.apply_style(self._segments(self._cells[name]), style), total)
        strip = strip.crop_extend(scroll_x, scroll_x + width, style)
        if not (row == self.cursor and self.has_focus):
            self._strips[name] = ((sig, row % 2), strip)
        return strip

    # ------------------------------------------------------------ keys
