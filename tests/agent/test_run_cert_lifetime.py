"""The run's certificate outlives any run (console/transport/link_tls.py): a detached run made
more than 30 days ago still dials back and is still accepted (issue 45)."""

from __future__ import annotations

import datetime
import socket
import threading
import time

import pytest
from cryptography import x509
from mscon.agent import tls
from mscon.console.transport.link_tls import VALID_FOR, make_run_tls


def test_the_certificate_lives_ten_years() -> None:
    cert = x509.load_pem_x509_certificate(make_run_tls().cert.encode())
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_after_utc - now > datetime.timedelta(days=3649) and VALID_FOR.days == 3650
    assert cert.not_valid_before_utc < now


@pytest.mark.parametrize("age_days", [31, 400, 3000])
def test_a_run_made_long_ago_still_dials_back(age_days: int) -> None:
    """Both ends with the certificate of a run started ``age_days`` ago, checked by OpenSSL at
    today's time: the handshake and the pin hold."""
    made = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=age_days)
    run = make_run_tls(now=made)
    got: list[object] = []
    with socket.create_server(("127.0.0.1", 0)) as srv:

        def serve() -> None:
            raw, _ = srv.accept()
            try:
                sock = tls.server_context(run.cert, run.key).wrap_socket(
                    raw, server_side=True, do_handshake_on_connect=False
                )
                tls.handshake(sock, time.monotonic() + 10)
                tls.check_peer(sock, run.cert)
                link = tls.TlsSock(sock)
                link.sendall(b"back\n")
                link.close()
            except OSError as exc:
                got.append(exc)
                raw.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        sock = tls.connect("127.0.0.1", srv.getsockname()[1], run.cert, run.key, 10)
        link = tls.TlsSock(sock)
        line = link.recv(100, time.monotonic() + 10)
        link.close()
        t.join(10)
    assert got == [] and line == b"back\n"
