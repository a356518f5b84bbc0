"""agent/tls.py and agent/gate.py with real sockets: the contexts accept the run's certificate only
(another one, a look-alike signed by the same key, plain TCP: refused), the key's file never
outlives the loading nor is readable by anyone else, one TLS connection carries a reader and
writers at once, and the pending-handshake count pushes out the busiest address's oldest."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from mscon.agent import gate, tls
from mscon.console.transport.link_tls import RunTls, make_run_tls

RUN = make_run_tls()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    srv = socket.create_server(("127.0.0.1", 0))
    yield srv
    srv.close()


def _serve_once(srv: socket.socket, material: RunTls, out: list) -> threading.Thread:
    """Accept one connection with ``material``'s server context; ``out`` gets what it read (or
    the exception that refused the peer)."""

    def run() -> None:
        raw, _ = srv.accept()
        sock: socket.socket = raw
        try:
            sock = tls.server_context(material.cert, material.key).wrap_socket(
                raw, server_side=True, do_handshake_on_connect=False
            )
            tls.handshake(sock, time.monotonic() + 5)
            tls.check_peer(sock, material.cert)
            link = tls.TlsSock(sock)
            link.sendall(b"hello\n")
            out.append(link.recv(100, time.monotonic() + 5))
            link.close()
        except (OSError, ssl.SSLError) as exc:
            out.append(exc)
            sock.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_the_pinned_certificate_is_accepted_both_ways(listener: socket.socket) -> None:
    got: list = []
    t = _serve_once(listener, RUN, got)
    sock = tls.connect("127.0.0.1", listener.getsockname()[1], RUN.cert, RUN.key, 5)
    link = tls.TlsSock(sock)
    assert link.recv(100, time.monotonic() + 5) == b"hello\n"
    assert sock.version() in ("TLSv1.2", "TLSv1.3")
    link.sendall(b"hi")
    t.join(10)
    link.close()
    assert got == [b"hi"]


@pytest.mark.parametrize("who", ["client", "server"])
def test_a_peer_with_another_certificate_is_refused(listener: socket.socket, who: str) -> None:
    other = make_run_tls()
    got: list = []
    server_side, client_side = (RUN, other) if who == "client" else (other, RUN)
    t = _serve_once(listener, server_side, got)
    with pytest.raises(ssl.SSLError):
        sock = tls.connect("127.0.0.1", listener.getsockname()[1], client_side.cert, client_side.key, 5)
        tls.TlsSock(sock).recv(100, time.monotonic() + 5) or sock.recv(1)  # TLS 1.3: the alert comes later
    t.join(10)
    assert len(got) == 1 and isinstance(got[0], (OSError, ssl.SSLError)), got


def _look_alike(material: RunTls) -> str:
    """Another certificate with the run's name and key: it verifies against the run's as trust
    anchor, so only the exact-bytes pin tells them apart."""
    key = serialization.load_pem_private_key(material.key.encode(), None)
    real = x509.load_pem_x509_certificate(material.cert.encode())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(real.subject)
        .issuer_name(real.issuer)
        .public_key(key.public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for ext in real.extensions:
        builder = builder.add_extension(ext.value, ext.critical)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()  # type: ignore[arg-type]


def test_a_look_alike_certificate_fails_the_pin(listener: socket.socket) -> None:
    look_alike = RunTls(_look_alike(RUN), RUN.key)
    got: list = []
    t = _serve_once(listener, look_alike, got)
    with pytest.raises(ssl.SSLError):  # OpenSSL's own check, or the pin (NotPinned)
        tls.connect("127.0.0.1", listener.getsockname()[1], RUN.cert, RUN.key, 5)
    t.join(10)
    assert got and isinstance(got[0], Exception)

    # The pin by itself: exact bytes, whatever a verifier would have made of the look-alike.
    class Peer:
        def __init__(self, pem: str) -> None:
            self.der = ssl.PEM_cert_to_DER_cert(pem)

        def getpeercert(self, binary_form: bool) -> bytes:
            return self.der

    tls.check_peer(Peer(RUN.cert), RUN.cert)
    with pytest.raises(tls.NotPinned):
        tls.check_peer(Peer(look_alike.cert), RUN.cert)


def test_plain_tcp_gets_nothing_and_is_refused(listener: socket.socket) -> None:
    got: list = []
    t = _serve_once(listener, RUN, got)
    plain = socket.create_connection(listener.getsockname(), 5)
    plain.sendall(b'{"node": "node2", "nonce": "00", "mac": "00"}\n')
    plain.settimeout(5)
    answer = b""
    try:
        while chunk := plain.recv(4096):
            answer += chunk
    except ConnectionResetError:
        pass
    t.join(10)
    plain.close()
    assert b"hello" not in answer  # at most a TLS alert
    assert len(got) == 1 and isinstance(got[0], ssl.SSLError), got
    # A TLS client meeting a plain-TCP server: refused too, within its deadline.
    srv2 = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: srv2.accept()[0].sendall(b"plain text\n" * 10), daemon=True).start()
    with pytest.raises((ssl.SSLError, OSError)):
        tls.connect("127.0.0.1", srv2.getsockname()[1], RUN.cert, RUN.key, 3)
    srv2.close()


def test_one_connection_carries_a_reader_and_writers_at_once(listener: socket.socket) -> None:
    """Two threads write, one reads, on one TlsSock, while the peer echoes: every line comes back
    whole and in order. (The race the lock prevents, OpenSSL's one connection state used by two
    threads at once, shows only now and then: this checks the carrying, not the race.)"""

    def echo() -> None:
        raw, _ = listener.accept()
        sock = tls.server_context(RUN.cert, RUN.key).wrap_socket(raw, server_side=True)
        link = tls.TlsSock(sock)
        while chunk := link.recv(65536):
            link.sendall(chunk)
        link.close()

    threading.Thread(target=echo, daemon=True).start()
    link = tls.TlsSock(tls.connect("127.0.0.1", listener.getsockname()[1], RUN.cert, RUN.key, 5))
    count, body = 1500, b"x" * 700

    def write(tag: bytes) -> None:
        for i in range(count):
            link.sendall(tag + b"%d " % i + body + b"\n")

    writers = [threading.Thread(target=write, args=(tag,)) for tag in (b"a", b"b")]
    for w in writers:
        w.start()
    got = b""
    deadline = time.monotonic() + 60
    while got.count(b"\n") < 2 * count:
        got += link.recv(65536, deadline)
    for w in writers:
        w.join()
    link.close()
    lines = got.split(b"\n")[:-1]
    for tag in (b"a", b"b"):
        assert [line for line in lines if line.startswith(tag)] == [
            tag + b"%d " % i + body for i in range(count)
        ]


def test_pending_pushes_out_the_oldest_of_the_busiest_address() -> None:
    p = gate.Pending()
    assert p.add("f1", "10.0.0.1", 3) == []
    assert p.add("x1", "10.0.0.9", 3) == []
    assert p.add("x2", "10.0.0.9", 3) == []
    assert p.add("x3", "10.0.0.9", 3) == ["x1"]  # the flood's oldest, not the follower's
    assert p.add("x4", "10.0.0.9", 3) == ["x2"]
    assert p.keys() == ["f1", "x3", "x4"]
    assert p.discard("f1") and not p.discard("f1")
    assert len(p) == 2 and "x3" in p


def test_a_peer_that_showed_the_run_certificate_is_never_pushed_out() -> None:
    """A flood from a node's own address (another user on it) cannot close a connection past TLS."""
    p = gate.Pending()
    assert p.add("node", "10.0.0.1", 3) == []
    assert p.trust("node")
    assert p.add("x1", "10.0.0.1", 3) == []
    assert p.add("x2", "10.0.0.1", 3) == []
    assert p.add("x3", "10.0.0.1", 3) == ["x1"]  # the same address, yet the node's stays
    assert p.add("x4", "10.0.0.1", 3) == ["x2"]
    assert "node" in p and p.discard("node")
    assert not p.trust("x1")  # pushed out already: the caller closes it


def test_when_every_handshake_holds_the_certificate_the_newcomer_is_refused() -> None:
    p = gate.Pending()
    for i in range(3):
        assert p.add(i, f"10.0.0.{i}", 3) == [] and p.trust(i)
    assert p.add("x", "10.0.0.9", 3) == ["x"]
    assert "x" not in p and len(p) == 3


def test_dial_tries_again_while_the_listener_closes_it_before_its_answer(listener: socket.socket) -> None:
    """What a node sees when a flood pushes its connection out: closed before TLS, then closed
    after TLS before the first answer; the third connection is served."""
    port = listener.getsockname()[1]
    served: list = []

    def run() -> None:
        raw, _ = listener.accept()
        raw.close()  # pushed out before the handshake
        raw, _ = listener.accept()
        sock = tls.server_context(RUN.cert, RUN.key).wrap_socket(
            raw, server_side=True, do_handshake_on_connect=False
        )
        tls.handshake(sock, time.monotonic() + 5)
        sock.close()  # pushed out after it, before the answer
        raw, _ = listener.accept()
        sock = tls.server_context(RUN.cert, RUN.key).wrap_socket(
            raw, server_side=True, do_handshake_on_connect=False
        )
        tls.handshake(sock, time.monotonic() + 5)
        link = tls.TlsSock(sock)
        link.sendall(b"answer\n")
        served.append(link.recv(100, time.monotonic() + 5))
        link.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def first(sock: ssl.SSLSocket) -> bytes:
        link = tls.TlsSock(sock)
        got = link.recv(100, time.monotonic() + 5)
        if not got:
            raise EOFError("closed before the answer")
        link.sendall(b"thanks")
        return got

    sock, got = tls.dial("127.0.0.1", port, RUN.cert, RUN.key, 10, first)
    t.join(10)
    sock.close()
    assert got == b"answer\n" and served == [b"thanks"]


def test_dial_does_not_try_again_a_peer_without_the_run_certificate(listener: socket.socket) -> None:
    other = make_run_tls()
    got: list = []
    t = _serve_once(listener, other, got)
    t0 = time.monotonic()
    with pytest.raises(ssl.SSLError):
        tls.dial("127.0.0.1", listener.getsockname()[1], RUN.cert, RUN.key, 10)
    t.join(10)
    assert time.monotonic() - t0 < 5 and len(got) == 1  # one try, refused at once
