"""A sustained flood of connections that never authenticate, for the gate's tests (agent/gate.py).

``Flood(host, port, sources, total)`` keeps ``total`` TCP connections open to ``host``:``port``
from the addresses ``sources`` in turn (127.0.0.0/8 is all loopback: each address is another host
as a listener counts them), opening a new one for every one the listener closes (``rate`` a
second at most), until ``stop``. Every other connection sends the header of a TLS ClientHello's
record and then nothing (a handshake begun, never a whole hello); the rest send nothing at all.
``opened`` counts the connections made, ``closed`` those the listener closed.
"""

from __future__ import annotations

import contextlib
import errno
import resource
import select
import socket
import threading
import time

import pytest

# A TLS handshake record (type 22, version 3.1) announcing 255 bytes that never come.
TLS_START = b"\x16\x03\x01\x00\xff"


def raise_nofile(at_least: int) -> None:
    """This process may hold ``at_least`` descriptors (the flood's); skip, saying why, if not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < at_least:
        if hard != resource.RLIM_INFINITY and hard < at_least:
            pytest.skip(f"the flood needs {at_least} descriptors in the test process (hard limit {hard})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (at_least, hard))


class Flood:
    def __init__(self, host: str, port: int, sources: list[str], total: int, rate: float = 1000.0) -> None:
        self.host, self.port, self.sources, self.total = host, port, sources, total
        self.rate = rate  # new connections a second at most, once ``total`` are open
        self.opened = 0
        self.closed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._socks: dict[int, socket.socket] = {}
        self._poll = select.poll()  # not select(): the flood's descriptors go past 1,024
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        src = self.sources[self.opened % len(self.sources)]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((src, 0))
            sock.setblocking(False)
            rc = sock.connect_ex((self.host, self.port))
            if rc not in (0, errno.EINPROGRESS):
                raise OSError(rc, errno.errorcode.get(rc, str(rc)))
        except OSError as exc:
            sock.close()
            if len(self.errors) < 20:
                self.errors.append(f"{src}: {exc}")
            return
        begun = self.opened % 2 == 1
        self.opened += 1
        self._socks[sock.fileno()] = sock
        # POLLOUT once: connected (the TLS start goes then); POLLIN: the listener closed it.
        self._poll.register(sock, select.POLLIN | (select.POLLOUT if begun else 0))

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            allowed = self.total + int((time.monotonic() - start) * self.rate)
            while len(self._socks) < self.total and self.opened < allowed and not self._stop.is_set():
                self._open()
                if self.errors and len(self._socks) < self.total // 2:
                    break  # out of ports or descriptors: wait for closes
            for fd, ev in self._poll.poll(50):
                sock = self._socks.get(fd)
                if sock is None:
                    continue
                if ev & select.POLLOUT:
                    with contextlib.suppress(OSError):
                        sock.send(TLS_START)
                    self._poll.modify(fd, select.POLLIN)
                if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    try:
                        data = sock.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if data:
                        continue  # a TLS alert or the like: the close follows
                    self._poll.unregister(fd)
                    del self._socks[fd]
                    sock.close()
                    self.closed += 1
        for fd, sock in list(self._socks.items()):
            self._poll.unregister(fd)
            sock.close()
        self._socks.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
