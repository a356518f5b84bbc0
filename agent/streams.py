"""Reading in threads: lines from a byte stream, connections from a listening socket.

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import socket
from typing import Callable


def read_lines(read: Callable[[int], bytes], emit: Callable[[str], None]) -> None:
    """Call ``emit`` with each non-empty line ``read`` yields (b"" or OSError: the end), decoded
    leniently, until the stream ends; a last unterminated line is dropped (a torn message)."""
    pending = b""
    while True:
        try:
            chunk = read(65536)
        except OSError:
            chunk = b""
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                emit(line.decode("utf-8", errors="replace"))


def close_socket(sock: socket.socket) -> None:
    """Shut down both ways (the peer sees the end at once), then close."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def accept_forever(sock: socket.socket, on_conn: Callable[[socket.socket], None]) -> None:
    """Hand every connection to ``on_conn`` until the listening socket is closed."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        on_conn(conn)
