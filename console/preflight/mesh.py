"""The mesh probe conversation: every node listens on a free port of the address its peers dial
(the first one at the scheduler's address, MS_SCHED_HOST), answering only callers that prove the
mesh's secret, then dials every other one, and says which connections it made. The
console turns the answers into the mesh and scheduler results (``checks.mesh_result``,
``checks.sched_result``)."""

from __future__ import annotations

import asyncio
import secrets

from mscon.agent.protocol import MeshClose, MeshListen, MeshListening, MeshProbe, MeshResult
from mscon.console.engine.session import ClusterSession
from mscon.console.preflight.router import Lost, Router, next_answer

_LISTEN_WAIT_S = 10.0
_PROBE_TIMEOUT_S = 3.0  # per connection in the mesh test


def targets_of(session: ClusterSession, sched: str) -> dict[str, tuple[str, int]]:
    """The address each node is reached at by the others: the first node at MS_SCHED_HOST (what
    the ranks will dial), the others at their address, the address SSH reached them at, or
    their host name. The port is filled in when each node listens."""
    out = {}
    for i, link in enumerate(session.links.values()):
        node = link.plan.node
        if i == 0:
            host = sched
        elif node.address:
            host = node.address
        elif node.transport == "local":
            host = "127.0.0.1"
        elif link.hello is not None and link.hello.ssh_addr:
            host = link.hello.ssh_addr
        else:
            host = link.transport.resolved_host()
        out[link.name] = (host, 0)
    return out


async def probe(
    session: ClusterSession,
    router: Router,
    deadline: float,
    nodes: list[str],
    targets: dict[str, tuple[str, int]],
    avoid_port: int,
    listen_s: float,
) -> dict[str, list[dict] | None]:
    """Each node's connections to the others (None where it did not answer); fills in the ports of
    ``targets``. ``avoid_port`` is the scheduler's (left free for it); each node listens for at most
    ``listen_s``, and every listener is closed at the end."""
    # The mesh's secret: on the agents' stdin only; callers and listeners prove it, never send it.
    token = secrets.token_hex(16)

    async def listen(node: str) -> tuple[str, int | str]:
        # Each node listens on the address its peers will dial (never all of its addresses).
        msg = MeshListen(token=token, host=targets[node][0], timeout_s=listen_s, avoid_port=avoid_port)
        if not await session.send(node, msg):
            return node, "not connected"
        try:
            _, answer = await asyncio.wait_for(
                next_answer(router.queue(node, "listen"), deadline), _LISTEN_WAIT_S
            )
        except (Lost, TimeoutError) as exc:
            return node, str(exc) or "no answer"
        assert isinstance(answer, MeshListening)
        return node, answer.port if answer.port else (answer.error or "cannot listen")

    listening = dict(await asyncio.gather(*(listen(n) for n in nodes)))
    for node, got in listening.items():
        if isinstance(got, int):
            targets[node] = (targets[node][0], got)
    peers = tuple(
        {"name": n, "host": targets[n][0], "port": got}
        for n, got in listening.items()
        if isinstance(got, int)
    )

    async def dial(node: str) -> tuple[str, list[dict] | None]:
        if not await session.send(node, MeshProbe(peers=peers, token=token, timeout_s=_PROBE_TIMEOUT_S)):
            return node, None
        try:
            _, answer = await asyncio.wait_for(
                next_answer(router.queue(node, "probe"), deadline), _PROBE_TIMEOUT_S + 10
            )
        except (Lost, TimeoutError):
            return node, None
        assert isinstance(answer, MeshResult)
        found = [dict(r) for r in answer.results]
        # A node that could not listen was never dialled: say why in every row.
        found += [
            {"name": n, "ok": False, "error": f"{n} could not listen: {got}"}
            for n, got in listening.items()
            if not isinstance(got, int)
        ]
        return node, found

    try:
        return dict(await asyncio.gather(*(dial(n) for n in nodes)))
    finally:
        await session.broadcast(MeshClose(), [n for n in nodes if session.links[n].open])
