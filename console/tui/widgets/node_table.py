"""Overview's table: one row per node (state, preflight summary, ranks, CPU and memory)."""

from __future__ import annotations

from collections import Counter

from rich.text import Text
from textual.widgets import DataTable

from ...events import CheckStatus, RankState
from .. import fmt
from ..model import ViewModel

COLUMNS = ("node", "host", "state", "checks", "ranks up", "failed", "CPU", "memory")


def checks_summary(model: ViewModel, node: str) -> Text:
    counts = Counter(c.status for (n, _), c in model.state.checks.items() if n == node)
    if not counts:
        return Text("-", style="dim")
    text = Text()
    for status, style in ((CheckStatus.FAIL, "bold red"), (CheckStatus.WARN, "yellow"), (CheckStatus.OK, "")):
        if counts[status]:
            text.append(f"{counts[status]} {status.value} ", style=style)
    return text


class NodeTable(DataTable[str | Text]):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for c in COLUMNS:
            self.add_column(c, key=c)

    def show(self, model: ViewModel) -> None:
        st = model.state
        per_node: dict[str, list[int | float]] = {n: [0, 0, 0.0, 0] for n in st.nodes}
        for r in st.workers():
            agg = per_node.setdefault(r.node, [0, 0, 0.0, 0])
            if r.state.live:
                agg[0] += 1
            if r.state in (RankState.FAILED, RankState.HUNG, RankState.LOST):
                agg[1] += 1
            agg[2] += r.cpu_percent or 0.0
            agg[3] += r.rss_bytes or 0
        keys = {str(k.value) for k in self.rows}
        if keys != set(per_node):
            self.clear()
            for name in per_node:
                self.add_row(*([""] * len(COLUMNS)), key=name)
        for name, (up, failed, cpu, rss) in per_node.items():
            view = st.nodes.get(name)
            row = (
                fmt.line(name),
                fmt.line(view.host) if view and view.host else "-",
                fmt.node_state(view.state) if view else Text("-"),
                checks_summary(model, name),
                str(up),
                Text(str(failed), style=fmt.ROOT_STYLE if failed else ""),
                f"{cpu:.0f}%" if cpu else "-",
                fmt.size(rss) if rss else "-",
            )
            for col, value in zip(COLUMNS, row, strict=True):
                if self.get_cell(name, col) != value:
                    self.update_cell(name, col, value, update_width=True)
