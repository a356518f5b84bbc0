"""The gate (agent/gate.py) never closes a real peer to make room (issue 45, item 3): what a flood
of connections that never authenticate may push out, counted by the real ``Pending``; and a
detached run of two real agents whose follower dials in, and dials in again after its link is
reset, while 2,000 such connections come from its own address and from 64 others."""

from __future__ import annotations

import contextlib
import itertools
import socket
import ssl
import threading
from pathlib import Path

from conftest import wait_for
from detached_agents import RUN_TLS, DetachedAgent
from flood import Flood, raise_nofile
from mscon.agent import gate, tls
from mscon.agent import protocol as P
from test_detached_redial import Relay

NODE = "10.0.0.1"


class SturdyRelay(Relay):
    """test_detached_redial's relay, whose connection to the coordinator may be refused (its port's
    queue full of the flood's): the follower's connection is closed then, and it dials again."""

    def _serve(self) -> None:
        while True:
            try:
                follower, _ = self.listener.accept()
            except OSError:
                return
            try:
                coordinator = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                coordinator.settimeout(None)
            except OSError:
                follower.close()
                continue
            self.pairs.append((follower, coordinator))
            for src, dst in ((follower, coordinator), (coordinator, follower)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()


def _attackers(n: int) -> list[str]:
    return [f"10.1.{i // 250}.{i % 250 + 1}" for i in range(n)]


def test_63_pending_from_other_addresses_and_a_64th_leave_the_node_its_connection() -> None:
    """The issue's case: the node's connection first, 63 from other addresses fill the gate, the
    64th comes. Before: the counts tie, the oldest of all (the node's) was closed."""
    p = gate.Pending()
    assert p.add("node", NODE) == []
    for i, host in enumerate(_attackers(63)):
        assert p.add(i, host) == []
    victims = p.add("x64", "10.9.9.9")
    assert "node" not in victims and "node" in p
    assert len(p) <= gate.PENDING_MAX


def test_a_flood_from_the_nodes_own_address_closes_its_own_not_the_node_that_began() -> None:
    """Another user on the node floods from its address: the node's connection, whose first bytes
    began a TLS handshake, stays however many come; the address holds at most PER_HOST_MAX."""
    now = [0.0]
    p = gate.Pending(clock=lambda: now[0])
    assert p.add("node", NODE, valid=True) == []
    closed = []
    for i in range(500):
        now[0] += 0.01  # 100 a second: some of the flood is old, some young
        closed += p.add(i, NODE if i % 2 else _attackers(64)[i % 64])
    assert "node" in p and "node" not in closed
    held = [k for k in p.keys() if k != "node"]
    assert sum(1 for k in held if k % 2) < gate.PER_HOST_MAX
    assert len(p) <= gate.PENDING_MAX


def test_a_silent_newcomer_gets_the_time_a_flood_takes_to_go_round() -> None:
    """A node's connection whose hello is not read yet, among a flood of silent ones from its own
    address: the flood's oldest go first, so the node's lasts until the flood has gone round."""
    p = gate.Pending()
    for i in range(8):
        assert p.add(i, NODE, cap=8) == []
    closed = p.add("node", NODE, cap=8)
    for i in range(8, 14):
        closed += p.add(i, NODE, cap=8)
    assert closed == list(range(7)) and "node" in p
    p.began("node")  # its hello came: no silent one pushes it out now
    for i in range(14, 100):
        p.add(i, NODE, cap=8)
    assert "node" in p


def test_a_stalled_handshake_goes_before_a_young_one() -> None:
    """Of connections that began a TLS handshake, one that has not finished it in YOUNG_S goes
    before one that just began (a node's)."""
    now = [0.0]
    p = gate.Pending(clock=lambda: now[0])
    for i in range(4):
        assert p.add(i, f"10.1.0.{i}", cap=4, valid=True) == []
    now[0] += gate.YOUNG_S
    assert p.add("node", NODE, cap=4, valid=True) == [3]
    assert "node" in p


def test_a_trusted_peer_is_never_shed_and_a_newcomer_is_refused_when_all_are() -> None:
    p = gate.Pending()
    for i in range(3):
        assert p.add(i, NODE, cap=3) == [] and p.trust(i)
    assert p.add("x", NODE, cap=3) == ["x"]
    assert sorted(p.keys()) == [0, 1, 2]


def test_an_ipv6_flood_counts_as_one_address_per_64() -> None:
    """One host holds a whole /64: its addresses are one address to the per-address cap."""
    p = gate.Pending()
    closed = []
    for i in range(100):
        closed += p.add(i, f"2001:db8:0:1::{i + 1:x}")
    assert len(p) == gate.PER_HOST_MAX and len(closed) == 100 - gate.PER_HOST_MAX
    assert p.add("node", "2001:db8:0:2::1") == [] and "node" in p


def test_hello_waiting_tells_a_whole_client_hello_from_silence_and_a_partial_one() -> None:
    """What the Slurm port (asyncio: it cannot watch the handshake step by step) passes as
    ``valid``: a whole TLS ClientHello waits unread, peeked at without taking it."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        s_silent, _ = server.accept()
        partial = socket.create_connection(("127.0.0.1", port), timeout=5)
        partial.sendall(b"\x16\x03\x01\x00\xff\x01")  # a header announcing 255 bytes, one sent
        s_partial, _ = server.accept()
        hello = tls.client_context(RUN_TLS.cert, RUN_TLS.key).wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=5), do_handshake_on_connect=False
        )
        hello.setblocking(False)
        with contextlib.suppress(ssl.SSLWantReadError):
            hello.do_handshake()  # sends the ClientHello, then waits for the answer
        s_hello, _ = server.accept()
        wait_for(lambda: gate.hello_waiting(s_hello), 5, "the ClientHello seen")
        assert not gate.hello_waiting(s_silent) and not gate.hello_waiting(s_partial)
        assert s_hello.recv(2, socket.MSG_PEEK) == b"\x16\x03", "nothing taken: TLS reads it all"
        assert s_hello.getblocking(), "the socket's own mode untouched"
        for sock in (silent, partial, hello, s_silent, s_partial, s_hello):
            sock.close()
    finally:
        server.close()


def test_a_detached_run_keeps_its_follower_through_2000_connections_from_65_addresses(tmp_path: Path) -> None:
    """n1 dials in (its Detach) and, after its link is reset mid-run, dials in again, while a
    sustained flood keeps 2,000 connections at the coordinator's port from n1's own address
    (127.0.0.1: the relay's, as the coordinator sees it) and from 64 others. Neither node is
    lost, no restart is spent, and both ranks finish."""
    raise_nofile(2000 + 1024)
    steps = 300  # 15 s at 20 a second
    n0, n1 = DetachedAgent("n0"), DetachedAgent("n1")
    relay = flood = None
    try:
        n0.start(tmp_path / "n0", 0, steps=steps, rate=20.0)
        n1.start(tmp_path / "n1", 1, steps=steps, rate=20.0)
        port = n0.detach(
            role=P.Role.COORDINATOR, nodes=("n0", "n1"), workers={"r0": "n0", "r1": "n1"}
        ).coordinator_port
        relay = SturdyRelay(port)
        sources = ["127.0.0.1"] + [f"127.0.1.{i}" for i in range(1, 65)]
        flood = Flood("127.0.0.1", port, sources, 2000)
        wait_for(lambda: flood.opened >= 2000 and flood.closed >= 500, 60, "the flood under way")
        joined = n1.detach(role=P.Role.FOLLOWER, coordinator_host="127.0.0.1", coordinator_port=relay.port)
        assert joined.error == "", joined.error

        def r1_lines() -> int:
            n1.drain()
            return sum(len(m.lines) for m in n1.seen if isinstance(m, P.LogBatch) and m.name == "r1")

        wait_for(lambda: r1_lines() >= 10, 30, "r1 training under the coordinator")
        closed_before = flood.closed
        relay.reset()
        wait_for(lambda: len(relay.pairs) >= 2, 15, "the follower dialling in again")
        assert r1_lines() < steps, "the reset came after r1 had finished: nothing was tested"
        ended = n0.until(lambda m: isinstance(m, P.Coord) and m.kind == P.CoordKind.RUN_ENDED, timeout=90)
        n1.until(lambda m: isinstance(m, P.ProcExited), timeout=30)
        assert flood.closed > closed_before, "the flood stopped before the redial"
    finally:
        if flood is not None:
            flood.stop()
        n0.kill()
        n1.kill()
        if relay is not None:
            relay.close()
    print(
        "N0",
        n0.stderr.decode()[-3000:],
        "N1",
        n1.stderr.decode()[-3000:],
        flood.opened,
        flood.closed,
        len(relay.pairs),
    )
    assert isinstance(ended, P.Coord) and ended.outcome == "succeeded", ended
    coords = [m for m in n0.seen if isinstance(m, P.Coord)]
    assert [m for m in coords if m.kind in (P.CoordKind.NODE_LOST, P.CoordKind.RESTARTING)] == []
    exits = {m.name: m for m in itertools.chain(n0.seen, n1.seen) if isinstance(m, P.ProcExited)}
    assert {(n, m.exitcode, m.stopped_by_agent) for n, m in exits.items()} == {
        ("r0", 0, False),
        ("r1", 0, False),
    }
    assert b"Traceback" not in n0.stderr + n1.stderr
    assert not flood.errors, flood.errors
