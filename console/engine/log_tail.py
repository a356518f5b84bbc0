"""A rank's last log lines, with nothing allocated until its first line.

An empty ``deque(maxlen=50)`` already holds a 64-slot block: ~620 bytes for each of 80,000 ranks
(about 50 MiB) when the console streams the lines of only a few of them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator


class LogTail:
    """The last ``limit`` lines, oldest first (a bounded deque, made at the first line)."""

    __slots__ = ("_lines", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lines: collections.deque[str] | None = None

    def _deque(self) -> collections.deque[str]:
        if self._lines is None:
            self._lines = collections.deque(maxlen=self.limit)
        return self._lines

    def append(self, line: str) -> None:
        self._deque().append(line)

    def extend(self, lines: Iterable[str]) -> None:
        self._deque().extend(lines)

    def __len__(self) -> int:
        return 0 if self._lines is None else len(self._lines)

    def __iter__(self) -> Iterator[str]:
        return iter(()) if self._lines is None else iter(self._lines)

    def __reversed__(self) -> Iterator[str]:
        return iter(()) if self._lines is None else reversed(self._lines)

    def __contains__(self, line: object) -> bool:
        return self._lines is not None and line in self._lines
