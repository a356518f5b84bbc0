"""The transport interface: everything above it is the same for SSH and local nodes."""

from __future__ import annotations

import abc
import asyncio
import enum
import os
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from mscon.agent import layout
from mscon.agent.protocol import Message, ProtocolError, decode, encode, message_class
from mscon.console.config.inventory import NodeSpec
from mscon.console.config.safepath import UnsafePath, label, remote_within, within
from mscon.console.transport.bundle import AgentBundle, WorkdirArchive

LINE_LIMIT = 64 * 1024 * 1024  # a LogBatch of long lines can be large
# Bytes of lines a reader takes in one go when more are already buffered (one write of the agent's
# outbox, whose alarms come first): the alarms among them reach the console ahead of the rest.
READY_BYTES = 256 * 1024
# Before the peer has proved its key (a dial's challenge and proof lines are about 100 bytes): a
# line past this ends the connection, and no more than about twice this is buffered for it.
PRE_AUTH_LINE_LIMIT = 4096
Progress = Callable[[int], None]  # told the bytes of a fetch as they arrive


def pre_auth_reader() -> asyncio.StreamReader:
    """The reader of a network connection whose peer has not authenticated yet: its lines are
    bounded by ``PRE_AUTH_LINE_LIMIT`` (readline raises ValueError past it) until
    :func:`authenticated`."""
    return asyncio.StreamReader(limit=PRE_AUTH_LINE_LIMIT)


def authenticated(reader: asyncio.StreamReader) -> None:
    """The peer proved its key: its lines may be as long as an agent's (``LINE_LIMIT``)."""
    reader._limit = LINE_LIMIT  # noqa: SLF001 - asyncio's reader keeps its limit there (3.8 to 3.13)


class TransportKind(enum.Enum):
    """How a node is reached: named in every failure, so an srun node's is never called SSH's."""

    SSH = "ssh"
    SRUN = "srun"
    LOCAL = "local"


class NodeUnreachable(Exception):
    """Connecting, authenticating or deploying failed; the message says why, in one line."""


# Shown escaped: they could move the cursor, recolour or retitle the user's terminal, or reorder
# text (bidirectional overrides). Newlines and tabs stay: callers split the tail into lines.
_BIDI = frozenset(
    [*"\u061c\u200e\u200f\u2028\u2029", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))]
)


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\xNN``, ``\\uNNNN``), newlines and tabs kept."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch in "\n\t" or (0x20 <= o < 0x7F) or (o > 0x9F and ch not in _BIDI):
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        else:
            out.append(f"\\u{o:04x}")
    return "".join(out)


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
    def _stderr_raw(self) -> str: ...

    async def release(self) -> None:
        """Let go of a detached agent: close our end now, neither waiting for it nor killing it."""
        await self.close(wait_s=0.0)

    def stderr_tail(self) -> str:
        """The last few KiB the agent (or the shell before it) wrote to stderr, safe to print."""
        return printable(self._stderr_raw())

    def _line_ready(self) -> bool:
        """Whether a whole line is buffered (the next ``_readline`` returns without waiting); False
        where the transport cannot tell: its messages then come one at a time."""
        return False

    async def send(self, msg: Message) -> None:
        await self._write(encode(msg))

    async def send_line(self, line: str) -> None:
        """A message already encoded (``encode``): a broadcast encodes once for every node."""
        await self._write(line)

    def send_now(self, line: str) -> bool:
        """Hand an encoded message to the transport at once, without waiting for its buffer to
        drain (it goes out as the loop runs: a Stop to 10,000 nodes in one pass, no task each);
        False where this channel can only send by awaiting (``send_line`` then). Raises as a
        write does on a channel that is gone."""
        return False

    async def recv(self) -> Message | None:
        """The next message, or None once the agent's output ends."""
        while True:
            line = await self._readline()
            if not line:
                return None
            msg = decode_line(line)
            if msg is not None:
                return msg

    async def recv_ready(self, max_bytes: int = READY_BYTES) -> list[Message]:
        """The next message and those whose lines are already buffered behind it (about
        ``max_bytes`` of lines at most), in order; [] once the agent's output ends."""
        return [m for m in map(decode_line, await self.read_ready(max_bytes)) if m is not None]

    async def read_ready(self, max_bytes: int = READY_BYTES) -> list[str]:
        """The next line and those already buffered behind it (about ``max_bytes`` of them at
        most), undecoded; [] once the agent's output ends. A reader that has them all can hand on
        the alarms among them before it waits with the rest, and decode the rest only once the
        console has room for them (issue 44)."""
        while True:
            first = await self._readline()
            if not first:
                return []
            if first.strip():
                break
        out, taken = [first], 0
        while taken < max_bytes and self._line_ready():
            line = await self._readline()  # buffered: no wait
            if not line:
                break  # the end: the next read says so
            taken += len(line)
            out.append(line)
        return out


_TAG_AT = len('{"type":"')
_CLASSES: dict[str, type[Message] | None] = {}


def line_class(line: str) -> type[Message] | None:
    """The message class a line holds, told by its first bytes without decoding it (exact for
    lines ``encode`` wrote: the type tag first); None where they do not say."""
    if not line.startswith('{"type":"'):
        return None
    tag = line[_TAG_AT : line.find('"', _TAG_AT)]
    cls = _CLASSES.get(tag, Message)
    if cls is Message:
        try:
            cls = message_class(tag)
        except ProtocolError:
            cls = None
        if len(_CLASSES) < 1024:  # tags are a fixed set; a stray line's are not kept
            _CLASSES[tag] = cls
    return cls


def decode_line(line: str) -> Message | None:
    """A line's message; None for a blank line or something else that wrote to stdout (a login
    banner, a stray print): skipped."""
    if not line.strip():
        return None
    try:
        return decode(line)
    except ProtocolError:
        return None


def stream_line_ready(reader: asyncio.StreamReader) -> bool:
    """``AgentChannel._line_ready`` of a channel read with an asyncio ``StreamReader``."""
    return b"\n" in reader._buffer  # noqa: SLF001 - asyncio keeps it there (3.8 to 3.13); no public peek


class NodeTransport(abc.ABC):
    kind: ClassVar[TransportKind]  # each transport names its own

    def __init__(self, node: NodeSpec) -> None:
        self.node = node
        self.home = ""

    @property
    def cache_root(self) -> str:
        return layout.cache_folder(self.home)

    def run_dir(self, run_id: str) -> str:
        """The node's folder for this run; both must be plain names (``UnsafePath`` otherwise)."""
        parts = layout.run_parts(label(run_id, "run id"), label(self.node.name, "node name"))
        return remote_within(self.cache_root, *parts)

    def _fetch_dest(self, local: str, logs_root: str | None) -> Path:
        """Where fetched logs go: refused (``UnsafePath``) before anything is written if it could
        leave ``logs_root`` (or, without one, if it holds a ``..``)."""
        label(self.node.name, "node name")
        if logs_root is not None:
            return within(logs_root, os.path.relpath(local, logs_root))
        if "\0" in local or ".." in Path(local).parts:
            raise UnsafePath(f"log folder {local!r} would not stay where it is put")
        return Path(local)

    def _check_run_dir(self, remote: str) -> None:
        """``remote`` must lie under this node's cache folder (it names what is copied back)."""
        rel = posixpath.relpath(posixpath.normpath(remote), posixpath.normpath(self.cache_root))
        if "\0" in remote or rel == "." or rel == ".." or rel.startswith("../"):
            raise UnsafePath(f"{remote!r} is not a run folder under {self.cache_root!r}")

    def resolved_host(self) -> str:
        """The host name this node is reached by (after ~/.ssh/config's HostName, for SSH)."""
        return self.node.host

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    async def ensure_agent(self, bundle: AgentBundle) -> str:
        """Make sure the agent bundle is on the node; returns the folder to put on PYTHONPATH."""

    @abc.abstractmethod
    async def upload_workdir(self, archive: WorkdirArchive) -> str:
        """Put the workdir archive on the node (skipped when present); returns its path."""

    @abc.abstractmethod
    async def start_agent(self, agent_dir: str, python: str, mode: dict | None = None) -> AgentChannel:
        """Start the agent; ``mode`` goes into its start header ({"mode": "attach", "run": RUN_ID}:
        a relay to a detached run; {"mode": "ls"}: list the node's runs)."""

    @abc.abstractmethod
    async def fetch_run_dir(
        self,
        remote: str,
        local: str,
        logs_root: str | None = None,
        include: tuple[str, ...] = (),
        progress: Progress | None = None,
    ) -> int:
        """Copy the node's run directory (logs, metrics; not the synced workdir, and not the
        checkpoints unless ``include`` names them: ``layout.FETCHED_ON_REQUEST``) to ``local``;
        the bytes copied. ``progress`` is told each amount of bytes as it arrives.

        ``local`` must stay inside ``logs_root`` when given (``UnsafePath``, before anything is
        written). Only plain file names, regular files and folders are copied; symbolic links on
        the node are never followed, so nothing outside the run directory comes back.
        """

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def holds_run(self, run_id: str) -> bool:
        """Whether this node already has a folder for ``run_id`` (an earlier run's: the id is taken
        here). Asked once connected, before a generated id is used."""

    @property
    def syncs_workdir(self) -> bool:
        return True
