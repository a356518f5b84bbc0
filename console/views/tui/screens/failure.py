"""Failure: the root cause in red (exit code, signal or hang; traceback or stack), and the victims."""

from __future__ import annotations

from mscon.console.engine.events import Failure, FailureKind, JobState
from mscon.console.engine.root_cause import describe
from mscon.console.engine.state import ClusterState
from mscon.console.views.tui import fmt
from mscon.console.views.tui.feed import Changes
from mscon.console.views.tui.model import ViewModel
from mscon.console.views.tui.widgets.log_view import line_style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static


def failure_text(model: ViewModel) -> Text:
    st = model.state
    root = st.root_cause()
    text = Text()
    if root is None:
        att = st.attempt
        text.append("No failure so far", style="green")
        if att is not None and att.stop_reason:
            text.append(f" (stopping: {fmt.line(att.stop_reason)})", style="yellow")
        text.append(".\n")
    else:
        text.append("ROOT CAUSE  ", style="bold white on red")
        text.append(f" {fmt.line(describe(root))}\n", style=fmt.ROOT_STYLE)
        text.append(_how(root) + "\n")
        text.append(f"first failure by the clock of the {root.clock}; shell code {root.code}\n", style="dim")
        if root.evidence:
            text.append(f"MindSpore says: {fmt.line(root.evidence, 400)}\n", style="yellow")
        body, title = _body(root)
        if body:
            text.append(f"\n{title}:\n", style="bold")
            for ln in body:
                safe = fmt.line(ln)
                text.append(f"  {safe}\n", style=line_style(safe) or "")
    victims = [s for s in st.rank_summaries() if s.role == "victim" and (root is None or s.name != root.name)]
    if victims:
        text.append("\nVictims (stopped by mscon after the root cause):\n", style="bold")
        for v in victims:
            text.append(f"  {v.name} on {fmt.line(v.node)}: {v.status}", style="dim")
            text.append(f", last step {v.last_step if v.last_step is not None else '-'}\n", style="dim")
    if st.job is JobState.AWAITING_OPERATOR:
        text.append(f"\nr restarts the whole group {restart_outlook_text(st)}\n", style="bold")
    earlier = [a for a in st.attempt_summaries() if a.root_cause is not None and a.root_cause is not root]
    if earlier:
        text.append("\nEarlier attempts:\n", style="bold")
        for a in earlier:
            text.append(f"  attempt {a.attempt}: {a.outcome.value}: {fmt.line(describe(a.root_cause))}\n")
    return text


def restart_outlook_text(st: ClusterState) -> str:
    """How a restart now would start: "warm: ..." or "cold: why"."""
    warm, why = st.restart_outlook()
    if warm:
        return "warm: every node's standby cluster has joined, so it skips MindSpore's cluster join"
    return f"cold: {fmt.line(why)}; it is a full launch"


def _how(f: Failure) -> str:
    # An exit's detail is ProcExited.describe() ("killed by SIGKILL", "exit code 7").
    return f"hung: {f.detail}" if f.kind in (FailureKind.HUNG, FailureKind.STOPPED) else f.detail


def _body(f: Failure) -> tuple[list[str], str]:
    if f.traceback:
        return f.traceback.splitlines()[-40:], "traceback"
    if f.stack:
        return f.stack.splitlines()[-40:], "where it was stuck"
    return list(f.tail[-20:]), "last lines"


class FailureView(VerticalScroll):
    DEFAULT_CSS = """
    FailureView #failure { height: auto; padding: 0 1; }
    """

    def __init__(self, model: ViewModel, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = model

    def compose(self) -> ComposeResult:
        yield Static(id="failure")

    def show(self, ch: Changes | None) -> None:
        if ch is not None and not ch.failure and not ch.structure:
            return
        self.query_one("#failure", Static).update(failure_text(self.model))
