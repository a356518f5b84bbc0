"""Overview's table: one row per node (state, preflight summary, ranks, CPU and memory)."""

from __future__ import annotations

import time
from collections import Counter

from mscon.console.engine.events import CheckStatus
from mscon.console.views import plain
from mscon.console.views.tui import fmt
from mscon.console.views.tui.model import ViewModel
from rich.cells import cell_len
from rich.text import Text
from textual.timer import Timer
from textual.widgets import DataTable

THROTTLE_S = 0.5
COLUMNS = ("node", "host", "state", "checks", "ranks up", "failed", "CPU", "memory")


def check_counts(model: ViewModel) -> dict[str, Counter[CheckStatus]]:
    """Each node's results by status, in one pass over them (not one pass per node)."""
    out: dict[str, Counter[CheckStatus]] = {}
    for (node, _), c in model.state.checks.items():
        out.setdefault(node, Counter())[c.status] += 1
    return out


def checks_summary(counts: Counter[CheckStatus] | None) -> Text:
    if not counts:
        return Text("-", style="dim")
    text = Text()
    for status, style in ((CheckStatus.FAIL, "bold red"), (CheckStatus.WARN, "yellow"), (CheckStatus.OK, "")):
        if counts[status]:
            text.append(f"{counts[status]} {status.value} ", style=style)
    return text


class NodeTable(DataTable[str | Text]):
    def on_mount(self) -> None:
        self._widths: dict[str, int] = {}  # the widest cell of each column so far
        self.cursor_type = "row"
        self.zebra_stripes = True
        for c in COLUMNS:
            self.add_column(c, key=c)

    _shown_at = 0.0
    _later: Timer | None = None

    def show(self, model: ViewModel, now: bool = True) -> None:
        """Bring the rows up to date; with ``now`` False (only numbers changed) at most every
        THROTTLE_S, the last change caught up by a timer: the table sums every rank's figures,
        8,000 ranks on 1,000 rows, and CPU and memory change once a second anyway."""
        if not now and time.monotonic() - self._shown_at < THROTTLE_S:
            if self._later is None:
                self._later = self.set_timer(THROTTLE_S, lambda: self.show(model))
            return
        if self._later is not None:
            self._later.stop()
            self._later = None
        self._shown_at = time.monotonic()
        st = model.state
        checks = check_counts(model)
        per_node: dict[str, list[int | float]] = {n: [0, 0, 0.0, 0] for n in st.nodes}
        for r in st.workers():
            agg = per_node.setdefault(r.node, [0, 0, 0.0, 0])
            if r.state in fmt.LIVE:
                agg[0] += 1
            if r.state in fmt.FAILED:
                agg[1] += 1
            agg[2] += r.cpu_percent or 0.0
            agg[3] += r.rss_bytes or 0
        rows = {
            name: (
                fmt.line(name),
                fmt.line(view.host) if view and view.host else "-",
                fmt.node_state(view.state) if view else Text("-"),
                checks_summary(checks.get(name)),
                str(up),
                Text(str(failed), style=fmt.ROOT_STYLE if failed else ""),
                f"{cpu:.0f}%" if cpu else "-",
                plain.size(rss) if rss else "-",
            )
            for name, (up, failed, cpu, rss) in per_node.items()
            for view in (st.nodes.get(name),)
        }
        if {str(k.value) for k in self.rows} != rows.keys():
            # New rows with their values: DataTable sizes the columns as the rows come in.
            self.clear()
            for name, row in rows.items():
                self.add_row(*row, key=name)
            self._widths = {
                c: max([_width(c), *(_width(row[i]) for row in rows.values())]) for i, c in enumerate(COLUMNS)
            }
            return
        for name, row in rows.items():
            for col, value in zip(COLUMNS, row, strict=True):
                if self.get_cell(name, col) != value:
                    # A width update only for a cell wider than any before it in its column:
                    # DataTable re-measures the whole column for a narrower one, and 1,000 rows
                    # of changing figures made that quadratic (seconds a frame).
                    width = _width(value)
                    grow = width > self._widths.get(col, 0)
                    if grow:
                        self._widths[col] = width
                    self.update_cell(name, col, value, update_width=grow)


def _width(value: str | Text) -> int:
    return value.cell_len if isinstance(value, Text) else cell_len(value)
