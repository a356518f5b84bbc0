"""Modal dialogs: confirm an action, the quit choice, and the key help of the screen beneath."""

from __future__ import annotations

import enum

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Label, Static

_DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 72; height: auto; max-height: 90%; border: thick $accent; background: $surface;
    padding: 1 2; }}
{name} .body {{ height: auto; margin-bottom: 1; }}
{name} Horizontal {{ height: auto; align: center middle; }}
{name} Button {{ margin: 0 1; }}
"""


class ConfirmScreen(ModalScreen[bool]):
    """Yes or no: ``y``/enter confirms, ``n``/esc cancels."""

    DEFAULT_CSS = _DIALOG_CSS.format(name="ConfirmScreen")
    BINDINGS = [
        Binding("y", "answer(True)", "Confirm"),
        Binding("n,escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, title: str, body: str, confirm: str) -> None:
        super().__init__()
        self.title_text, self.body, self.confirm = title, body, confirm

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.title_text, style="bold"))
            yield Static(self.body, classes="body")
            with Horizontal():
                yield Button(f"{self.confirm} (y)", variant="error", id="yes")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class QuitChoice(enum.Enum):
    STOP = "stop"
    DETACH = "detach"
    CANCEL = "cancel"


class QuitScreen(ModalScreen[QuitChoice]):
    DEFAULT_CSS = _DIALOG_CSS.format(name="QuitScreen")
    BINDINGS = [
        Binding("s,y", "choose('stop')", "Stop the run and quit"),
        Binding("d", "choose('detach')", "Detach"),
        Binding("c,n,escape", "choose('cancel')", "Cancel"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text("Quit mscon?", style="bold"))
            yield Static(
                "Stop: every rank on every node is stopped (TERM, then KILL after the grace period) and "
                "the logs are fetched before mscon exits.\n"
                "Detach: the run goes on without the console (node 0's agent stops or restarts the "
                "group on a failure); mscon attach RUN_ID comes back to it.",
                classes="body",
            )
            with Horizontal():
                yield Button("Stop the run and quit (s)", variant="error", id="stop")
                yield Button("Detach (d)", id="detach")
                yield Button("Cancel (c)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(QuitChoice(event.button.id or "cancel"))

    def action_choose(self, choice: str) -> None:
        self.dismiss(QuitChoice(choice))


def key_rows(screen: Screen[object]) -> list[tuple[str, str]]:
    """(keys, what they do) for every binding active on ``screen``: the screen's and the app's first,
    then the focused widget's (scrolling and the like)."""
    seen: dict[str, list[str]] = {}
    order: dict[str, int] = {}
    for active in screen.active_bindings.values():
        b = active.binding
        what = b.description or b.tooltip or b.action.replace("_", " ")
        if b.system and not b.description:
            continue
        rank = 0 if active.node is screen else 1 if active.node is screen.app else 2
        order[what] = min(order.get(what, rank), rank)
        keys = seen.setdefault(what, [])
        display = screen.app.get_key_display(b)
        if display not in keys:
            keys.append(display)
    rows = sorted(seen, key=lambda what: order[what])
    return [(" ".join(seen[what]), what) for what in rows]


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = (
        _DIALOG_CSS.format(name="HelpScreen")
        + """
    HelpScreen > Vertical { width: 80; }
    HelpScreen VerticalScroll { height: auto; max-height: 40; }
    """
    )
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, title: str, rows: list[tuple[str, str]], note: str = "") -> None:
        super().__init__()
        self.title_text, self.rows, self.note = title, rows, note

    def compose(self) -> ComposeResult:
        text = Text()
        width = max((len(k) for k, _ in self.rows), default=4) + 2
        for keys, what in self.rows:
            text.append(keys.ljust(width), style="bold")
            text.append(f"{what}\n")
        if self.note:
            text.append(f"\n{self.note}", style="dim")
        with Vertical():
            yield Label(Text(f"Keys: {self.title_text}", style="bold"))
            with VerticalScroll():
                yield Static(text, id="help-keys")
            yield Label(Text("esc: close", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)
