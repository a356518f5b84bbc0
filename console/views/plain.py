"""Plain text every view writes the same way: escaped names and lines, byte sizes, elapsed times.

The headless reporter, the TUI (through fmt.py), ``mscon runs``, ``mscon prune`` and the check
report all read these; nothing here knows about a terminal, colours or Rich.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """Control characters escaped (\\x1b, newlines): a name can never forge a line or drive the terminal."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" for c in text
    )


def size(nbytes: float | None, na: str = "-") -> str:
    if nbytes is None:
        return na
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def elapsed(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
