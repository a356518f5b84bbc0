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


def oneline(text: str) -> str:
    """``text`` with every non-printable character escaped, so it can never span lines."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
