"""A follower whose link to its coordinator is reset dials again, within the watchdog, before
anyone calls its node lost (issue 34; the rule is ``agent/liveness.py``, the policy's): its rank
trains on and the run ends as if nothing happened.

Two real agents (n0 the coordinator, n1 a follower) run one fake rank each; n1 reaches n0
through a relay of the test's, which resets the link once, mid-run (both of its sockets shut
down: each end reads the end of its stream)."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

from conftest import wait_for
from detached_agents import DetachedAgent
from mscon.agent import layout
from mscon.agent import protocol as P

STEPS = 120  # 6 s at 20 a second: the reset comes about 1 s in


class Relay:
    """Passes bytes between each connection it accepts and the coordinator; ``reset`` ends the
    connection of the moment, both ways."""

    def __init__(self, target: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target = target
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                follower, _ = self.listener.accept()
            except OSError:
                return
            coordinator = socket.create_connection(("127.0.0.1", self.target))
            self.pairs.append((follower, coordinator))
            for src, dst in ((follower, coordinator), (coordinator, follower)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
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
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def reset(self) -> None:
        for s in self.pairs[-1]:
            with contextlib.suppress(OSError):  # its pump may have shut it down already (ENOTCONN)
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for pair in self.pairs:
            for s in pair:
                s.close()


def test_a_follower_whose_link_is_reset_dials_again_and_the_run_ends_ok(tmp_path: Path) -> None:
    n0, n1 = DetachedAgent("n0"), DetachedAgent("n1")
    relay = None
    try:
        n0.start(tmp_path / "n0", 0, steps=STEPS, rate=20.0)
        n1.start(tmp_path / "n1", 1, steps=STEPS, rate=20.0)
        port = n0.detach(
            role=P.Role.COORDINATOR, nodes=("n0", "n1"), workers={"r0": "n0", "r1": "n1"}
        ).coordinator_port
        relay = Relay(port)
        joined = n1.detach(role=P.Role.FOLLOWER, coordinator_host="127.0.0.1", coordinator_port=relay.port)
        assert joined.error == ""

        def r1_lines() -> int:
            n1.drain()
            return sum(len(m.lines) for m in n1.seen if isinstance(m, P.LogBatch) and m.name == "r1")

        wait_for(lambda: r1_lines() >= 10, 30, "r1 training under the coordinator")
        relay.reset()
        wait_for(lambda: len(relay.pairs) >= 2, 15, "the follower dialling in again")
        assert r1_lines() < STEPS, "the reset came after r1 had finished: nothing was tested"
        ended = n0.until(lambda m: isinstance(m, P.Coord) and m.kind == P.CoordKind.RUN_ENDED, timeout=60)
        n1.until(lambda m: isinstance(m, P.ProcExited), timeout=30)
    finally:
        n0.kill()
        n1.kill()
        if relay is not None:
            relay.close()
    assert isinstance(ended, P.Coord) and ended.outcome == "succeeded", ended
    lost = [m for m in n0.seen if isinstance(m, P.Coord) and m.kind == P.CoordKind.NODE_LOST]
    assert lost == []
    exits = {m.name: m for m in n0.seen + n1.seen if isinstance(m, P.ProcExited)}
    assert {(n, m.exitcode, m.stopped_by_agent) for n, m in exits.items()} == {
        ("r0", 0, False),
        ("r1", 0, False),
    }
    log = Path(layout.log_path(tmp_path / "n1", 0, "r1")).read_text()
    assert "training finished" in log and f"step: {STEPS}," in log
    assert b"Traceback" not in n0.stderr + n1.stderr
