"""How the console reaches a node: SSH (asyncssh) or, for the local default, a subprocess."""

from __future__ import annotations

from ..inventory import Inventory, NodeSpec
from .base import AgentChannel, NodeTransport, NodeUnreachable
from .local import LocalTransport
from .ssh import SshOptions, SshTransport

__all__ = ["AgentChannel", "NodeTransport", "NodeUnreachable", "SshOptions", "make_transport"]


def make_transport(inv: Inventory, node: NodeSpec, ssh: SshOptions) -> NodeTransport:
    if node.transport == "local":
        return LocalTransport(node)
    return SshTransport(node, inv, ssh)
