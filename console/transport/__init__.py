"""How the console reaches a node: SSH (asyncssh), srun inside a Slurm allocation, or, for the
local default, a subprocess."""

from __future__ import annotations

from mscon.console.config.inventory import Inventory, NodeSpec
from mscon.console.transport.base import AgentChannel, NodeTransport, NodeUnreachable, TransportKind
from mscon.console.transport.local import LocalTransport
from mscon.console.transport.ssh import SshOptions, SshTransport

__all__ = [
    "AgentChannel",
    "NodeTransport",
    "NodeUnreachable",
    "SshOptions",
    "TransportKind",
    "make_transport",
]


def make_transport(inv: Inventory, node: NodeSpec, ssh: SshOptions) -> NodeTransport:
    if node.transport == "local":
        return LocalTransport(node)
    if node.transport == "slurm":  # nodes of an allocation (console/config/slurm.py): one srun step
        from mscon.console.transport.slurm import slurm_transport

        return slurm_transport(inv, node, ssh.connect_semaphore or inv)
    return SshTransport(node, inv, ssh)
