"""The one-line run status at the top of every screen."""

from __future__ import annotations

from mscon.console.views import plain
from mscon.console.views.tui import fmt
from mscon.console.views.tui.model import ViewModel
from rich.text import Text
from textual.widgets import Static


def status_text(model: ViewModel) -> Text:
    st = model.state
    up, failed, total = model.rank_counts()
    att = st.attempt
    text = Text()
    text.append(f" {model.source.title} ", style="reverse")
    text.append(f" {st.run_id or '-'}  ")
    text.append_text(fmt.job_state(st.job))
    text.append(f"  attempt {att.number if att else '-'}")
    if att is not None and att.warm:
        text.append(" (warm)", style="green")
    text.append(f"  restarts {model.restarts_used()}/{st.max_restarts}")
    text.append(f"  ranks {up}/{total} up")
    if failed:
        text.append(f"  {failed} failed/hung", style=fmt.ROOT_STYLE)
    if model.feed.stragglers:
        text.append(f"  {len(model.feed.stragglers)} straggler(s)", style=fmt.STRAGGLER_STYLE)
    text.append(f"  elapsed {plain.elapsed(model.elapsed_s())}")
    if model.query:
        text.append(f"  filter: {model.query}", style="bold")
    return text


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; }
    """

    _last: Text | None = None

    def show(self, model: ViewModel) -> None:
        text = status_text(model)
        if text != self._last:  # one fixed line: no layout pass
            self._last = text
            self.update(text, layout=False)
