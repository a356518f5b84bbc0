"""Reading in threads: lines from a byte stream, connections from a listening socket.

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from typing import Callable

# Out of file descriptors (or kernel buffers) while accepting: wait this long, then accept again.
# The connections wait in the kernel's queue meanwhile, and one that is refused there costs nothing
# here; a listener that returned instead would never accept anyone again.
ACCEPT_BACKOFF_S = 0.2
EXHAUSTED = frozenset([errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM])
# A peer that left before it was taken, or a signal: take the next one.
_RETRY = frozenset([errno.ECONNABORTED, errno.EINTR, errno.EPROTO, errno.EAGAIN, errno.EPERM])
# The listening socket was shut down (EINVAL: what a blocked accept gets) or closed.
_ENDED = frozenset([errno.EINVAL, errno.EBADF, errno.ENOTSOCK])


class LineTooLong(Exception):
    """A line over the reader's bound: what follows it cannot be trusted, so the reading stops."""


class LineSplitter:
    """Bytes in, complete lines out (without their newline), in linear time: a long line is neither
    re-scanned nor re-copied per chunk. With ``max_line``, a longer line raises LineTooLong as soon
    as it is too long, not when (if ever) its newline comes."""

    def __init__(self, max_line: int | None = None) -> None:
        self.max_line = max_line
        self._parts: list = []  # the pending line's chunks, joined once its newline comes
        self._size = 0

    def feed(self, chunk: bytes) -> list:
        nl = chunk.find(b"\n")
        if nl < 0:
            if chunk:
                self._parts.append(chunk)
                self._size += len(chunk)
                self._check(self._size)
            return []
        self._parts.append(chunk[:nl])
        lines = [b"".join(self._parts)]
        lines += chunk[nl + 1 :].split(b"\n")
        rest = lines.pop()
        self._parts = [rest] if rest else []
        self._size = len(rest)
        for line in lines:
            self._check(len(line))
        self._check(self._size)
        return lines

    def rest(self) -> bytes:
        """The pending, unterminated bytes."""
        return b"".join(self._parts)

    def _check(self, size: int) -> None:
        if self.max_line is not None and size > self.max_line:
            raise LineTooLong("a line over %d bytes" % self.max_line)


def read_lines(
    read: Callable[[int], bytes], emit: Callable[[str], None], max_line: int | None = None
) -> None:
    """Call ``emit`` with each non-empty line ``read`` yields (b"" or OSError: the end), decoded
    leniently, until the stream ends; a last unterminated line is dropped (a torn message).
    Raises LineTooLong (and reads no further) at a line over ``max_line`` bytes."""
    split = LineSplitter(max_line)
    while True:
        try:
            chunk = read(65536)
        except OSError:
            chunk = b""
        if not chunk:
            return
        for line in split.feed(chunk):
            if line.strip():
                emit(line.decode("utf-8", errors="replace"))


def close_socket(sock: socket.socket) -> None:
    """Shut down both ways (the peer sees the end at once), then close."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def note(what: str) -> None:
    """One line to stderr: a detached agent's ``agent.err`` (its stdout is the console's, or null)."""
    try:
        sys.stderr.write("mscon agent: %s\n" % what)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Backoff:
    """One listener's troubles accepting, said on stderr once per episode (not once per accept)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.troubled = False

    def failed(self, exc: OSError) -> bool:
        """True: wait ACCEPT_BACKOFF_S before accepting again (out of descriptors, or an error it
        does not know); False: accept the next one now."""
        if exc.errno in _RETRY:
            return False
        if not self.troubled:
            why = "out of file descriptors" if exc.errno in EXHAUSTED else "accept failed (%s)" % exc
            note("%s: %s; still listening, new connections wait meanwhile" % (self.name, why))
        self.troubled = True
        return True

    def accepted(self) -> None:
        if self.troubled:
            note("%s: accepting again" % self.name)
            self.troubled = False


def accept_forever(
    sock: socket.socket, on_conn: Callable[[socket.socket], None], name: str = "listener"
) -> None:
    """Hand every connection to ``on_conn`` until the listening socket is closed (``sock.close()``,
    best after ``shutdown``, which wakes a blocked accept). Out of file descriptors it backs off and
    goes on; ``on_conn`` failing (no thread left to start) costs that connection only."""
    backoff = Backoff(name)
    while sock.fileno() != -1:
        try:
            conn, _ = sock.accept()
        except OSError as exc:
            if sock.fileno() == -1 or exc.errno in _ENDED:
                return  # closed or shut down: the end
            if backoff.failed(exc):
                time.sleep(ACCEPT_BACKOFF_S)  # a back-off, not a synchronisation: nothing waits on it
            continue
        backoff.accepted()
        try:
            on_conn(conn)
        except Exception as exc:  # noqa: BLE001 - e.g. RuntimeError: can't start new thread
            note("%s: dropped a connection (%s)" % (name, exc))
            close_socket(conn)
