"""The local transport: the agent as a subprocess of the console; no SSH, no workdir copy."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from ..bundle import AGENT_PACKAGE, AgentBundle, WorkdirArchive, agent_argv
from .base import LINE_LIMIT, AgentChannel, NodeTransport, NodeUnreachable


class LocalChannel(AgentChannel):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._stderr = bytearray()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self._stderr += chunk
            del self._stderr[:-8192]

    async def _write(self, data: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data.encode())
        await self.proc.stdin.drain()

    async def _readline(self) -> str:
        assert self.proc.stdout is not None
        return (await self.proc.stdout.readline()).decode("utf-8", errors="replace")

    async def close(self, wait_s: float = 10.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), wait_s)
        except TimeoutError:
            self.proc.kill()  # its ranks die with it (parent-death signal)
            await self.proc.wait()
        await self._stderr_task

    def stderr_tail(self) -> str:
        return self._stderr.decode("utf-8", errors="replace")


class LocalTransport(NodeTransport):
    async def connect(self) -> None:
        self.home = str(Path.home())

    async def ensure_agent(self, bundle: AgentBundle) -> str:
        root = Path(self.cache_root) / bundle.dirname
        pkg = root / AGENT_PACKAGE
        if not pkg.is_dir():
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
            for name, data in bundle.files.items():
                (tmp / name).write_bytes(data)
            try:
                os.rename(tmp, pkg)
            except OSError:  # another console won the race; its copy is identical
                shutil.rmtree(tmp, ignore_errors=True)
        return str(root)

    async def upload_workdir(self, archive: WorkdirArchive) -> str:
        raise NotImplementedError("local nodes run in the workdir itself")

    @property
    def syncs_workdir(self) -> bool:
        return False

    async def start_agent(self, agent_dir: str, python: str) -> AgentChannel:
        try:
            proc = await self._spawn(agent_argv(python, agent_dir, self.node.name))
        except OSError as exc:
            raise NodeUnreachable(f"{self.node.name}: the agent did not start with {python}: {exc}") from None
        return LocalChannel(proc)

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT,
            # Its own session: a terminal's Ctrl-C reaches the console, which stops the run in order.
            start_new_session=True,
        )

    async def fetch_run_dir(self, remote: str, local: str) -> None:
        src = Path(remote)
        if not src.is_dir():
            return
        shutil.copytree(src, local, dirs_exist_ok=True, ignore=shutil.ignore_patterns("work"))

    async def close(self) -> None:
        return None
