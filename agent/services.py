"""What the agent does besides running ranks: preflight checks (run one at a time by a thread),
the collective mesh probe, and resolving the scheduler's name. A mixin of ``main.Agent``.
"""

from __future__ import annotations

import queue
import socket
import threading

from . import protocol as P
from .checks.mesh import MeshListener, probe_peer
from .outbox import ConsoleGone


class Services:
    """Checks, mesh probes and name resolution for the console (``main.Agent``'s state)."""

    def _run_checks(self, msg: P.RunChecks) -> None:
        """Checks run in one worker thread, in the order asked, so each ChecksDone answers the
        oldest open request and the agent keeps answering pings and stops meanwhile."""
        if self._checks is None:
            self._checks = queue.Queue()
            threading.Thread(target=self._checks_worker, name="checks", daemon=True).start()
        self._checks.put(msg)

    def _checks_worker(self) -> None:
        assert self._checks is not None
        while True:
            msg = self._checks.get()
            try:
                from . import checks  # imported on first use: a plain run never loads it

                found = checks.run_node_checks(msg.names, msg.params)
            except Exception as exc:  # noqa: BLE001 - an agent without checks still answers
                found = [{"name": "checks", "status": "warn", "value": "cannot run checks: %s" % exc}]
            try:
                for r in found:
                    self.send(
                        P.CheckResult(
                            node=self.node,
                            name=str(r.get("name", "?")),
                            status=str(r.get("status", "warn")),
                            value=str(r.get("value", "")),
                            remedy=str(r.get("remedy", "")),
                            detail=str(r.get("detail", "")),
                        )
                    )
                self.send(P.ChecksDone(node=self.node))
            except ConsoleGone:
                return

    def _mesh_listen(self, msg: P.MeshListen) -> None:
        if self._mesh is not None:
            self._mesh.close()
        try:
            self._mesh = MeshListener(self.node, msg.token, msg.timeout_s, msg.host, avoid=(msg.avoid_port,))
        except OSError as exc:
            self._mesh = None
            self.send(P.MeshListening(node=self.node, error="cannot listen: %s" % (exc.strerror or exc)))
            return
        self.send(P.MeshListening(node=self.node, port=self._mesh.port))

    def _mesh_probe(self, msg: P.MeshProbe) -> None:
        out: list = [None] * len(msg.peers)

        def one(i: int, peer: dict) -> None:
            out[i] = probe_peer(peer, msg.token, msg.timeout_s)

        peers = [dict(p) for p in msg.peers]
        threads = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in enumerate(peers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(msg.timeout_s + 2)
        results = tuple(r if r is not None else {"ok": False, "error": "no answer"} for r in out)
        try:
            self.send(P.MeshResult(node=self.node, results=results))
        except ConsoleGone:
            pass


def resolve(node: str, host: str) -> P.Resolved:
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return P.Resolved(node=node, host=host, error=str(exc))
    addrs = [str(info[4][0]) for info in infos]
    v4 = [a for a in addrs if ":" not in a]
    if not addrs:
        return P.Resolved(node=node, host=host, error="no address")
    return P.Resolved(node=node, host=host, address=(v4 or addrs)[0])
