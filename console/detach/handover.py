"""Detaching: handing a running attempt to the nodes, so the run outlives the console.

Node 0's agent becomes the coordinator (it drives the run's policy, agent/policy.py, as the
supervisor did); every other agent follows it over a signed link. Each node gets its own Start for
a next attempt with its Detach: argv and env never cross the coordinator's link.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import secrets
import socket
from dataclasses import replace

from mscon.agent import policy as policy_mod
from mscon.agent.policy import RunPolicy
from mscon.agent.protocol import Detach, Detached, Role, Start
from mscon.console.engine.session import ClusterSession
from mscon.console.transport.link_tls import make_run_tls

_ANSWER_S = 15.0  # each agent's Detached


def console_name() -> str:
    """Who detached (user@host pid): `mscon ls` shows it, a refused second attach names it."""
    return f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"


async def hand_over(
    session: ClusterSession,
    policy: RunPolicy,
    next_starts: list[Start],
    sched: str,
    hang_timeout_s: float | None,
    keep_warm_s: float = 0.0,
) -> str | None:
    """Hand the run to the nodes (in the session's order, node 0 first); the error (the run then
    stays attached, nothing changed) or None."""
    if policy.phase is not policy_mod.RunPhase.RUNNING:
        stopping = policy.phase is policy_mod.RunPhase.STOPPING
        return "the run is stopping" if stopping else "no attempt is running"
    names = list(session.links)
    down = [n for n, link in session.links.items() if not link.open or n in policy.done_nodes]
    if down:
        return f"{down[0]} has no running agent"
    secret = secrets.token_hex(32)
    run_tls = make_run_tls("mscon detached run")  # the coordinator link's TLS (agent/tls.py)
    console = console_name()
    lead = await session.request(
        names[0],
        Detach(
            role=Role.COORDINATOR,
            secret=secret,
            tls_cert=run_tls.cert,
            tls_key=run_tls.key,
            coordinator_host=sched,  # where it listens: the scheduler's address, node 0's own
            nodes=tuple(names),
            restarts_left=policy.restarts_left,
            backoff_s=policy.config.backoff_s,
            hang_timeout_s=hang_timeout_s or 0.0,  # 0: from each rank's pace (the coordinator's)
            next_start=next_starts[0].to_dict(),
            workers=dict(policy.config.workers),
            operator_wait_s=policy_mod.DETACHED_OPERATOR_WAIT_S,
            standby_ready=policy.standby_ready(),
            console=console,
            keep_warm_s=keep_warm_s,
        ),
        Detached,
        _ANSWER_S,
    )
    if isinstance(lead, str) or lead.error:
        return f"{names[0]}: {lead if isinstance(lead, str) else lead.error}"
    follow = Detach(
        role=Role.FOLLOWER,
        secret=secret,
        tls_cert=run_tls.cert,
        tls_key=run_tls.key,
        coordinator_host=sched,
        coordinator_port=lead.coordinator_port,
        hang_timeout_s=hang_timeout_s or 0.0,
        console=console,
        keep_warm_s=keep_warm_s,
    )
    answers = await asyncio.gather(
        *(
            session.request(n, replace(follow, next_start=next_starts[i].to_dict()), Detached, _ANSWER_S)
            for i, n in enumerate(names)
            if i > 0
        )
    )
    errors = [
        f"{n}: {a if isinstance(a, str) else a.error}"
        for n, a in zip(names[1:], answers, strict=True)
        if isinstance(a, str) or a.error
    ]
    if errors:
        # Back to normal on every node: the console keeps the policy.
        await asyncio.gather(*(session.request(n, Detach(role="cancel"), Detached, _ANSWER_S) for n in names))
        return "; ".join(errors)
    return None
