"""Every rank's log lines, kept on disk so that millions of lines cost a few bytes of memory each.

One spool file (in a private temporary folder, removed on close) takes the lines of all ranks in
arrival order; per rank, two arrays hold the offset and length of each of its lines. The rank
log view asks for the lines it shows (``line``), and searches run over ``lines`` in a thread.
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path


class LineStore:
    def __init__(self, directory: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="mscon-tui-", dir=directory)
        path = Path(self._tmp.name) / "lines.spool"
        self._w = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 - lives as long as the store
        self._fd = os.open(path, os.O_RDONLY)
        self._size = 0  # bytes handed to the writer
        self._flushed = 0  # bytes readable through _fd
        self._offsets: dict[str, array[int]] = {}
        self._lengths: dict[str, array[int]] = {}
        self.closed = False

    def append(self, name: str, lines: Iterable[str]) -> int:
        """Store lines of one rank; returns how many."""
        if self.closed:
            return 0
        offsets = self._offsets.get(name)
        if offsets is None:
            offsets = self._offsets[name] = array("Q")
            self._lengths[name] = array("I")
        lengths = self._lengths[name]
        pos = self._size
        chunks = []
        for line in lines:
            data = line.encode("utf-8", "replace")
            offsets.append(pos)
            lengths.append(len(data))
            chunks.append(data)
            pos += len(data) + 1
        if chunks:
            self._w.write(b"\n".join(chunks) + b"\n")
            self._size = pos
        return len(chunks)

    def flush(self) -> None:
        if not self.closed and self._flushed != self._size:
            self._w.flush()
            self._flushed = self._size

    def count(self, name: str) -> int:
        offsets = self._offsets.get(name)
        return len(offsets) if offsets is not None else 0

    def line(self, name: str, index: int) -> str:
        offsets = self._offsets.get(name)
        if offsets is None or not 0 <= index < len(offsets) or self.closed:
            return ""
        offset, length = offsets[index], self._lengths[name][index]
        if offset + length > self._flushed:
            self.flush()
        return os.pread(self._fd, length, offset).decode("utf-8", "replace")

    def lines(self, name: str, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, str]]:
        """(index, text) of lines ``start`` to ``stop`` (exclusive); safe in a thread once flushed."""
        end = self.count(name) if stop is None else min(stop, self.count(name))
        for i in range(max(0, start), end):
            if self.closed:
                return
            yield i, self.line(name, i)

    @property
    def bytes(self) -> int:
        return self._size

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._w.close()
        os.close(self._fd)
        self._tmp.cleanup()
