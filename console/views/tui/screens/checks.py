"""Checks: every preflight result, by node (status, value, remedy)."""

from __future__ import annotations

from mscon.console.engine.events import CheckStatus
from mscon.console.views.tui import fmt
from mscon.console.views.tui.feed import Changes
from mscon.console.views.tui.model import ViewModel
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

STATUS_STYLE = {
    CheckStatus.OK: "green",
    CheckStatus.WARN: "yellow",
    CheckStatus.FAIL: "bold red",
    CheckStatus.NA: "dim",
}


class ChecksView(Vertical):
    DEFAULT_CSS = """
    ChecksView #checks-head { height: auto; padding: 0 1; }
    ChecksView DataTable { height: 1fr; }
    """

    def __init__(self, model: ViewModel, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = model
        self._shown: list[tuple[str, str]] = []

    def compose(self) -> ComposeResult:
        yield Static(id="checks-head")
        yield DataTable[str | Text](id="checks-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for c in ("node", "check", "status", "value", "remedy"):
            table.add_column(c, key=c)

    def show(self, ch: Changes | None) -> None:
        if ch is not None and not ch.checks and not ch.structure:
            return
        st = self.model.state
        results = sorted(st.checks.items(), key=lambda kv: (kv[0][0] == "*", kv[0]))
        head = Text()
        if not results:
            head.append("No preflight results in this run (mscon check, or mscon up without --skip-check).")
        else:
            counts = {s: sum(1 for _, c in results if c.status is s) for s in CheckStatus}
            head.append(f"{len(results)} checks: ")
            for s in CheckStatus:
                if counts[s]:
                    head.append(f"{counts[s]} {s.value}  ", style=STATUS_STYLE[s])
            fin = st.checks_finished
            if fin is not None and fin.skipped:
                head.append(f"skipped: {', '.join(fin.skipped)}", style="dim")
        self.query_one("#checks-head", Static).update(head)
        keys = [k for k, _ in results]
        table = self.query_one(DataTable)
        if keys != self._shown:
            table.clear()
            self._shown = keys
            for (node, name), c in results:
                remedy = c.remedy or c.detail
                table.add_row(
                    fmt.line(node),
                    fmt.line(name),
                    Text(c.status.value, style=STATUS_STYLE[c.status]),
                    fmt.line(c.value),
                    fmt.line(remedy),
                    key=f"{node}\0{name}",
                )
        else:
            for (node, name), c in results:
                key = f"{node}\0{name}"
                table.update_cell(key, "status", Text(c.status.value, style=STATUS_STYLE[c.status]))
                table.update_cell(key, "value", fmt.line(c.value))
                table.update_cell(key, "remedy", fmt.line(c.remedy or c.detail))
