"""Nodes of a Slurm allocation: agents started by one ``srun`` step, dialling back over TCP.

One :class:`SlurmLauncher` per session (``slurm_launcher.py``) owns a listening socket and the
step, which runs a fixed boot on every node. Each task connects back, both sides prove they hold
the per-run key, and the console sends ``agent/dial.py`` over that connection; the dial then
serves the control protocol described there (the console's end: ``slurm_dial.py``). A
:class:`SlurmTransport` per node waits for its node's connection, deploys the agent bundle and the
workdir through it, has the dial start the normal agent on a second authenticated connection (that
socket is the agent's stdin and stdout), and fetches the logs back through it. No SSH key and no
shared file system are needed.

The connections are TLS with the run's certificate, pinned both ways (``agent/tls.py``), with the
key's HMAC proof inside: private and authenticated, whatever network the allocation has.
Closing the session closes every control connection: each dial ends its agent (which stops its
ranks) and exits, so the step ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import secrets
import tarfile
import tempfile
import weakref
from pathlib import Path
from typing import Any

from mscon.agent import layout
from mscon.console.config.inventory import Inventory, NodeSpec
from mscon.console.config.safepath import UnsafePath, is_plain_name, remote_within, within
from mscon.console.transport.base import (
    AgentChannel,
    NodeTransport,
    NodeUnreachable,
    Progress,
    TransportKind,
    stream_line_ready,
)
from mscon.console.transport.bundle import (
    AGENT_BOOT,
    AGENT_PACKAGE,
    AgentBundle,
    WorkdirArchive,
    agent_stdin_header,
)
from mscon.console.transport.private_copy import private_file, private_folders, private_subfolder
from mscon.console.transport.slurm_dial import AUTH_TIMEOUT_S, Control
from mscon.console.transport.slurm_launcher import SlurmLauncher


class SlurmChannel(AgentChannel):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctl: Control) -> None:
        self.reader, self.writer, self.ctl = reader, writer, ctl

    async def _write(self, data: str) -> None:
        self.writer.write(data.encode())
        await self.writer.drain()

    async def _readline(self) -> str:
        try:
            return (await self.reader.readline()).decode("utf-8", errors="replace")
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return ""

    def send_now(self, line: str) -> bool:
        self.writer.write(line.encode())
        return True

    def _line_ready(self) -> bool:
        return stream_line_ready(self.reader)

    async def close(self, wait_s: float = 10.0) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            if self.writer.can_write_eof():
                self.writer.write_eof()  # the agent reads EOF: it stops its ranks and exits
        try:
            await asyncio.wait_for(self.ctl.agent_done.wait(), wait_s)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ctl.kill_agent(), 5)
        self.writer.close()

    async def release(self) -> None:
        # Never kill on release. A detached agent cannot outlive this transport anyway: the srun
        # step ends with the console's connections, and Slurm ends every process of the step.
        self.writer.close()

    def _stderr_raw(self) -> str:
        # A refusal last: the line the session reports for a node whose connection ends.
        return self.ctl.stderr + (f"\n{self.ctl.refused}\n" if self.ctl.refused else "")


class SlurmTransport(NodeTransport):
    kind = TransportKind.SRUN

    def __init__(self, node: NodeSpec, launcher: SlurmLauncher) -> None:
        super().__init__(node)
        self.launcher = launcher
        self.ctl: Control | None = None
        launcher.hold(node)

    def _require(self) -> Control:
        if self.ctl is not None and self.ctl.refused:
            raise NodeUnreachable(self.ctl.refused)
        if self.ctl is None or self.ctl.closed.is_set():
            raise NodeUnreachable(f"{self.node.name}: not connected")
        return self.ctl

    def resolved_host(self) -> str:
        # The address this node reached the console from: an IP on the allocation's network,
        # which MindSpore's MS_SCHED_HOST needs (as SSH_CONNECTION gives over SSH).
        return self.ctl.peer_ip if self.ctl is not None and self.ctl.peer_ip else self.node.host

    async def connect(self) -> None:
        from mscon.console.engine.plan import node_python

        self.ctl = await self.launcher.control(self.node, node_python(self.node))
        self.home = self.ctl.home

    def _rel(self, remote: str) -> str:
        rel = posixpath.relpath(posixpath.normpath(remote), posixpath.normpath(self.cache_root))
        if rel.startswith("..") or rel == ".":
            raise UnsafePath(f"{remote!r} is not under {self.cache_root!r}")
        return rel

    async def _put(self, rel: str, data: bytes) -> None:
        await self._require().put(rel, data)

    async def _exists(self, rel: str) -> bool:
        return await self._require().exists(rel)

    async def ensure_agent(self, bundle: AgentBundle) -> str:
        root = remote_within(self.cache_root, bundle.dirname)
        pkg = posixpath.join(bundle.dirname, AGENT_PACKAGE)
        marker = posixpath.join(pkg, ".complete")
        if not await self._exists(marker):
            for name, data in bundle.files.items():
                # "checks/gpu.py" checked part by part here; the dial makes its folder.
                await self._put(remote_within(pkg, name), data)
            await self._put(marker, bundle.digest.encode())
        return root

    async def upload_workdir(self, archive: WorkdirArchive) -> str:
        rel = posixpath.join(layout.SYNC_DIR, archive.filename)
        if not await self._exists(rel):
            await self._require().put(rel, archive.chunks())
        return remote_within(self.cache_root, rel)

    async def start_agent(self, agent_dir: str, python: str, mode: dict | None = None) -> AgentChannel:
        ctl = self._require()
        try:
            # The same start header as over SSH, without the python line (the dial starts the
            # agent with its own interpreter: the one this launcher gave srun).
            header = agent_stdin_header(python, agent_dir, self.node.name, mode).split("\n", 1)[1]
        except ValueError as exc:
            raise NodeUnreachable(f"{self.node.name}: {exc}") from None
        token = secrets.token_hex(16)
        fut = self.launcher.expect_agent(token, self.node.host)
        try:
            await ctl.start_agent(token, AGENT_BOOT)
            reader, writer = await asyncio.wait_for(fut, AUTH_TIMEOUT_S * 2)
        except TimeoutError:
            raise NodeUnreachable(f"{self.node.name}: the agent did not connect back") from None
        finally:
            self.launcher.agents.pop(token, None)
        channel = SlurmChannel(reader, writer, ctl)
        with contextlib.suppress(OSError, RuntimeError):
            await channel._write(header)
        return channel

    async def fetch_run_dir(
        self,
        remote: str,
        local: str,
        logs_root: str | None = None,
        include: tuple[str, ...] = (),
        progress: Progress | None = None,
    ) -> int:
        dest = self._fetch_dest(local, logs_root)  # refused before anything is written
        self._check_run_dir(remote)
        ctl = self._require()
        with tempfile.TemporaryFile() as buf:
            await ctl.fetch(self._rel(remote), buf, include, progress)
            if buf.tell() == 0:
                return 0  # no run folder on the node
            buf.seek(0)
            private_folders(logs_root, dest)
            return await asyncio.to_thread(_extract, buf, dest, layout.not_fetched(include))

    async def holds_run(self, run_id: str) -> bool:
        return await self._exists(self._rel(self.run_dir(run_id)))

    async def close(self) -> None:
        await self.launcher.release(self.node.host)


def _extract(fileobj: Any, dest: Path, skip: frozenset[str] | None = None) -> int:
    """Plain names, folders and regular files only (none under a top-level name in ``skip``,
    default ``layout.not_fetched()``); nothing written through a link. The bytes of the files written."""
    skip = layout.not_fetched() if skip is None else skip
    total = 0
    with tarfile.open(fileobj=fileobj, mode="r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not all(is_plain_name(p) for p in parts) or parts[0] in skip:
                continue
            target = within(dest, *parts)
            if member.isdir():
                _private_levels(dest, parts)
            elif member.isreg():
                src = tar.extractfile(member)
                if src is None:
                    continue
                _private_levels(dest, parts[:-1])
                # 0600 whatever the umask or the archive's modes; a link there is never written through
                with os.fdopen(private_file(target), "wb") as out:
                    while data := src.read(1 << 20):
                        out.write(data)
                        total += len(data)
    return total


def _private_levels(dest: Path, parts: list[str]) -> None:
    """The folders ``parts`` names under ``dest``, each 0700 (tar need not list a folder first)."""
    for i in range(1, len(parts) + 1):
        private_subfolder(within(dest, *parts[:i]))


# One launcher per session. The session hands every factory call the same SshOptions, whose
# connect semaphore is made per session: it is the one per-session object a transport factory
# sees, so it keys the session's launcher (reopen() of a lost node reuses it; the preflight's
# nested smoke-test session gets its own step).
_LAUNCHERS: dict[int, tuple[weakref.ref[Any], SlurmLauncher]] = {}


def slurm_transport(inv: Inventory, node: NodeSpec, session_token: object) -> SlurmTransport:
    for key, (ref, launcher) in list(_LAUNCHERS.items()):
        if ref() is None or launcher.closed:
            del _LAUNCHERS[key]
    entry = _LAUNCHERS.get(id(session_token))
    if entry is None or entry[0]() is not session_token:
        entry = (weakref.ref(session_token), SlurmLauncher(inv))
        _LAUNCHERS[id(session_token)] = entry
    return SlurmTransport(node, entry[1])
