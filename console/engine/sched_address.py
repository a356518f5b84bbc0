"""Where MindSpore's scheduler listens (MS_SCHED_HOST): an IP, found before the first attempt."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from mscon.console.config.inventory import Inventory
from mscon.console.engine import exit_codes
from mscon.console.engine.plan import NodePlan
from mscon.console.engine.session import ClusterSession


@dataclass(frozen=True, slots=True)
class SchedulerAddress:
    """The address, or why there is none (a one-line error and its exit code)."""

    ip: str | None
    error: str = ""
    exit_code: int = 0


async def scheduler_address(
    inv: Inventory, plans: tuple[NodePlan, ...], session: ClusterSession
) -> SchedulerAddress:
    """MS_SCHED_HOST must be an IP: MindSpore does not resolve names (``Parse ip failed``).

    ``scheduler.host`` or the first node's ``address`` win and are resolved by the agent on
    the first node; otherwise the address the first node's agent was reached on (its
    SSH_CONNECTION), else its resolved HostName.
    """
    first = plans[0].node
    link = session.links[first.name]
    given = inv.scheduler.host or first.address
    field_name = "scheduler.host" if inv.scheduler.host else f"nodes[0].address ({first.name})"
    if given is None:
        if first.transport == "local":
            return SchedulerAddress("127.0.0.1")
        if link.hello is not None and link.hello.ssh_addr and _is_ip(link.hello.ssh_addr):
            return SchedulerAddress(link.hello.ssh_addr)
        given = link.transport.resolved_host()
        field_name = f"nodes[0].host ({first.name})"
    if _is_ip(given):
        return SchedulerAddress(given)
    answer = await session.resolve(first.name, given)
    if answer.address:
        return SchedulerAddress(answer.address)
    return SchedulerAddress(
        None,
        f"{inv.path}: {field_name}: cannot resolve {given!r} to an IP address on {first.name} "
        f"({answer.error}); MindSpore needs an IP in MS_SCHED_HOST: set scheduler.host",
        exit_codes.USAGE if inv.scheduler.host or first.address else exit_codes.UNREACHABLE,
    )


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
