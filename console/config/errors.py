"""The one error an inventory can raise: its ``str()`` is one line naming file:line:col and field."""

from __future__ import annotations

from pathlib import Path


class InventoryError(Exception):
    """A problem in an inventory file; ``str()`` is the one-line message shown to the user."""

    def __init__(self, path: Path | str, line: int, col: int, fieldname: str, message: str) -> None:
        path, fieldname, message = oneline(str(path)), oneline(fieldname), oneline(message)
        self.path, self.line, self.col, self.field, self.message = path, line, col, fieldname, message
        where = f"{path}:{line}:{col}" if line else path
        super().__init__(f"{where}: {fieldname}: {message}" if fieldname else f"{where}: {message}")
        # Every error found in the file's one pass (this one, the first found, among them).
        self.all: tuple[InventoryError, ...] = (self,)

    def lines(self) -> list[str]:
        """Every error of the file, one line each, in the file's order."""
        return [str(e) for e in sorted(self.all, key=lambda e: (e.line, e.col))]

    def report(self) -> str:
        """What the user is shown: every error, one per line (no trailing newline)."""
        return "\n".join(self.lines())


def gathered(errors: list[InventoryError]) -> InventoryError:
    """The first of ``errors`` (so ``str()`` stays the one line it always was), carrying them all."""
    first = errors[0]
    first.all = tuple(errors)
    return first


def oneline(text: str) -> str:
    """``text`` with every non-printable character escaped, so it can never span lines."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
