"""The transport interface: everything above it is the same for SSH and local nodes."""

from __future__ import annotations

import abc
import posixpath

from mscon.agent.protocol import Message, ProtocolError, decode, encode

from ..bundle import AgentBundle, WorkdirArchive
from ..inventory import NodeSpec

CACHE_DIR = ".cache/mscon"  # relative to the node user's home
LINE_LIMIT = 64 * 1024 * 1024  # a LogBatch of long lines can be large


class NodeUnreachable(Exception):
    """Connecting, authenticating or deploying failed; the message says why, in one line."""


class AgentChannel(abc.ABC):
    """The agent's stdin/stdout as typed messages."""

    @abc.abstractmethod
    async def _write(self, data: str) -> None: ...

    @abc.abstractmethod
    async def _readline(self) -> str: ...

    @abc.abstractmethod
    async def close(self, wait_s: float = 10.0) -> None:
        """Close stdin (the agent stops its ranks and exits), wait, then force."""

    @abc.abstractmethod
    def stderr_tail(self) -> str: ...

    async def send(self, msg: Message) -> None:
        await self._write(encode(msg))

    async def recv(self) -> Message | None:
        """The next message, or None once the agent's output ends."""
        while True:
            line = await self._readline()
            if not line:
                return None
            if not line.strip():
                continue
            try:
                return decode(line)
            except ProtocolError:
                # Something else wrote to stdout (a login banner, a stray print); skip it.
                continue


class NodeTransport(abc.ABC):
    def __init__(self, node: NodeSpec) -> None:
        self.node = node
        self.home = ""

    @property
    def cache_root(self) -> str:
        return posixpath.join(self.home, CACHE_DIR)

    def run_dir(self, run_id: str) -> str:
        # Both run id and node name: several nodes may share one home directory.
        return posixpath.join(self.cache_root, "runs", run_id, self.node.name)

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    async def ensure_agent(self, bundle: AgentBundle) -> str:
        """Make sure the agent bundle is on the node; returns the folder to put on PYTHONPATH."""

    @abc.abstractmethod
    async def upload_workdir(self, archive: WorkdirArchive) -> str:
        """Put the workdir archive on the node (skipped when present); returns its path."""

    @abc.abstractmethod
    async def start_agent(self, agent_dir: str, python: str) -> AgentChannel: ...

    @abc.abstractmethod
    async def fetch_run_dir(self, remote: str, local: str) -> None:
        """Copy the node's run directory (logs, metrics; not the synced workdir) to ``local``."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @property
    def syncs_workdir(self) -> bool:
        return True
