"""A follower's dial is tried again, with a growing pause, until its watchdog's deadline (issue 45,
item 3): a coordinator port that a flood keeps busy may close a try after TLS, or answer it
wrongly, and neither may cost the run its node. coord.dial_within, with real sockets."""

from __future__ import annotations

import queue
import socket
import threading
import time

import pytest
from detached_agents import RUN_TLS
from mscon.agent import tls
from mscon.agent.detached import coord

SECRET = "s3cret"
MATERIAL = {"cert": RUN_TLS.cert, "key": RUN_TLS.key}


class Impostor:
    """In front of the real coordinator: the first ``spoil`` connections get TLS with the run's
    certificate and a nonce, then a wrong proof (a LinkError at the follower) or a close after
    TLS; the rest are passed through to the coordinator."""

    def __init__(self, target: int, spoil: list[str]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.spoil, self.seen = target, list(spoil), 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            self.seen += 1
            how = self.spoil.pop(0) if self.spoil else "pass"
            threading.Thread(target=self._one, args=(raw, how), daemon=True).start()

    def _one(self, raw: socket.socket, how: str) -> None:
        if how == "pass":
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for src, dst in ((raw, upstream), (upstream, raw)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()
            return
        sock = tls.server_context(RUN_TLS.cert, RUN_TLS.key).wrap_socket(
            raw, server_side=True, do_handshake_on_connect=False
        )
        try:
            tls.handshake(sock, time.monotonic() + 5)
            link = tls.TlsSock(sock)
            if how == "close":
                link.close()  # pushed out after TLS, before the nonce
                return
            link.sendall(b'{"nonce": "n0"}\n')
            link.recv(4096, time.monotonic() + 5)  # the follower's hello
            link.sendall(b'{"mac": "not the proof"}\n')  # LinkError: no proof of the secret
            link.recv(4096, time.monotonic() + 5)
            link.close()
        except OSError:
            sock.close()

    def close(self) -> None:
        self.listener.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    while True:
        try:
            chunk = src.recv(65536)
            if not chunk:
                break
            dst.sendall(chunk)
        except OSError:
            break
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@pytest.fixture
def coordinator() -> tuple[coord.CoordServer, queue.Queue]:
    inbox: queue.Queue = queue.Queue()
    srv = coord.CoordServer(SECRET, ["node2"], inbox, host="127.0.0.1", **MATERIAL)
    yield srv, inbox
    srv.close()


def test_a_follower_dials_again_after_a_close_and_a_wrong_proof(
    coordinator: tuple[coord.CoordServer, queue.Queue],
) -> None:
    srv, inbox = coordinator
    front = Impostor(srv.port, ["close", "proof", "proof"])
    try:
        deadline = time.monotonic() + 20
        link = coord.dial_within(
            "127.0.0.1", front.port, SECRET, "node2", queue.Queue(), deadline, **MATERIAL
        )
        assert front.seen == 4, f"{front.seen} connections: the spoilt three, then the coordinator"
        kind, up, _ = inbox.get(timeout=5)
        assert kind == "peer_up" and up.node == "node2"
        link.close()
    finally:
        front.close()


def test_past_the_deadline_the_last_error_is_raised(
    coordinator: tuple[coord.CoordServer, queue.Queue],
) -> None:
    srv, _ = coordinator
    front = Impostor(srv.port, ["proof"] * 1000)
    try:
        t0 = time.monotonic()
        with pytest.raises(coord.LinkError, match="did not prove"):
            coord.dial_within("127.0.0.1", front.port, SECRET, "node2", queue.Queue(), t0 + 2.0, **MATERIAL)
        took = time.monotonic() - t0
        assert 1.5 <= took < 10, f"gave up after {took:.1f} s"
        assert front.seen >= 3, "tried again with a growing pause"
    finally:
        front.close()
