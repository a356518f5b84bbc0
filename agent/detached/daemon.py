"""A detached agent: a daemon that consoles reach through a Unix socket in the run folder.

The run folder is made mode 0700 and the socket 0600, and every connection's peer credentials are
checked as well: only the user the agent runs as gets in (root included only when it is that user).
Each client has its own writer thread and a bounded queue, so a stalled console never stalls the
agent; one that falls too far behind is dropped (it can attach again and replay what it missed).
Both its threads end when it leaves, whether it said goodbye or not; a line over ``LINE_MAX`` is
answered with an AgentError and the client closed, never buffered whole.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import struct
import threading

from .. import protocol as P
from ..layout import ERRORS, SOCKET, private_fd
from ..streams import LineTooLong, accept_forever, close_socket, read_lines

_CLIENT_BACKLOG = 200_000  # lines queued for one client before it is dropped
# Bytes in one line from a client: an Attach is a few KiB, a RunCommand less; anything longer is a
# broken or hostile client, and bounding it bounds what one client can make the agent hold.
LINE_MAX = 1 << 20


def peer_uid(sock: socket.socket) -> int | None:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", raw)[1]


class Client:
    """One console on the socket. Lines it sends go to ``inbox`` as ("client", self, line | None)."""

    def __init__(self, sock: socket.socket, inbox: queue.Queue, node: str = "") -> None:
        self.sock = sock
        self.inbox = inbox
        self.node = node  # this agent's node: it signs the errors the client gets from here
        self.out: queue.Queue = queue.Queue()
        self.attached = False  # its Attach was served: live messages go to it from now on
        self.read_only = True
        self.console = ""
        self.closed = False
        threading.Thread(target=self._read, name="client-read", daemon=True).start()
        threading.Thread(target=self._write, name="client-write", daemon=True).start()

    def send_line(self, line: str) -> None:
        if self.closed:
            return
        if self.out.qsize() > _CLIENT_BACKLOG:
            self.close()  # too slow: better a clean drop than an agent that runs out of memory
            return
        self.out.put(line)

    def end(self) -> None:
        """Close after what is queued has been written."""
        self.out.put(None)

    def _write(self) -> None:
        while True:
            line = self.out.get()
            if line is None or self.closed:
                break
            try:
                self.sock.sendall(line.encode("utf-8"))
            except OSError:
                break
        self.close()

    def _read(self) -> None:
        try:
            read_lines(self.sock.recv, lambda line: self.inbox.put(("client", self, line)), LINE_MAX)
        except LineTooLong:
            error = P.AgentError(node=self.node, message="a line over %d bytes: connection closed" % LINE_MAX)
            self.send_line(P.encode(error))
            self.end()
        # The peer is done sending (a relay half-closes after its Attach). Its end is the agent's
        # to order: the agent loop ends the client after answering what it sent, so an answer
        # queued after this point still goes out; then the writer closes (no thread left behind).
        self.inbox.put(("client", self, None))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.out.put(None)  # wakes the writer, which ends with the client
        close_socket(self.sock)


class SocketServer:
    """Listens on ``agent.sock`` in the current folder (the agent chdirs into its run folder)."""

    def __init__(self, run_dir: str, inbox: queue.Queue, node: str = "") -> None:
        self.inbox = inbox
        self.node = node
        os.chmod(run_dir, 0o700)
        os.chdir(run_dir)
        try:
            os.unlink(SOCKET)
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(SOCKET)
        finally:
            os.umask(old)
        os.chmod(SOCKET, 0o600)
        self.path = os.path.join(run_dir, SOCKET)
        self.sock.listen(16)
        self.uid = os.getuid()
        threading.Thread(target=self._accept, name="socket-accept", daemon=True).start()

    def _accept(self) -> None:
        accept_forever(self.sock, self._admit, "agent socket")

    def _admit(self, conn: socket.socket) -> None:
        if peer_uid(conn) != self.uid:
            conn.close()  # another user (the folder's mode should have stopped them already)
            return
        self.inbox.put(("client_up", Client(conn, self.inbox, self.node), None))

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread: it ends
        except OSError:
            pass
        try:
            self.sock.close()
            os.unlink(self.path)
        except OSError:
            pass


def daemonize(run_dir: str) -> None:
    """Leave the console's session: no controlling terminal, no SIGHUP, stdio off the SSH channel.

    Run after the last line to the console has been written: stdout goes to /dev/null from here.
    """
    try:
        os.setsid()  # fails when already a session leader (sshd made one): then nothing to leave
    except OSError:
        pass
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    err = private_fd(os.path.join(run_dir, ERRORS))
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(err, 2)
    os.close(null)
    os.close(err)
