"""The local transport: the agent as a subprocess of the console; no SSH, no workdir copy.

The agent starts exactly as on an SSH node (``/bin/sh`` with the fixed script and boot code from
``bundle.py``, the python path and node name on stdin), so the local tests exercise that path too.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from mscon.agent import layout
from mscon.console.config.safepath import within
from mscon.console.transport.base import (
    LINE_LIMIT,
    AgentChannel,
    NodeTransport,
    NodeUnreachable,
    Progress,
    TransportKind,
    stream_line_ready,
)
from mscon.console.transport.bundle import (
    AGENT_PACKAGE,
    AgentBundle,
    WorkdirArchive,
    agent_argv,
    agent_stdin_header,
)
from mscon.console.transport.private_copy import private_file, private_folders, private_subfolder

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


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

    def send_now(self, line: str) -> bool:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode())
        return True

    def _line_ready(self) -> bool:
        return self.proc.stdout is not None and stream_line_ready(self.proc.stdout)

    async def close(self, wait_s: float = 10.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), wait_s)
        except TimeoutError:
            self.proc.kill()  # its ranks die with it (parent-death signal)
            await self.proc.wait()
        await self._stderr_task

    def _stderr_raw(self) -> str:
        return self._stderr.decode("utf-8", errors="replace")

    async def release(self) -> None:
        # Never kill a detached agent: close our pipes and let it go (it runs in its own session).
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        self._stderr_task.cancel()


class LocalTransport(NodeTransport):
    kind = TransportKind.LOCAL

    async def connect(self) -> None:
        self.home = str(Path.home())

    async def ensure_agent(self, bundle: AgentBundle) -> str:
        root = within(self.cache_root, bundle.dirname)
        pkg = within(root, AGENT_PACKAGE)
        if not pkg.is_dir():
            # Every folder 0700 and every file 0600, whatever the umask (layout.private_dirs).
            layout.private_dirs(str(root))
            tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))  # 0700
            for name, data in bundle.files.items():
                path = within(tmp, name)  # "checks/gpu.py": each part checked, so it stays in tmp
                layout.private_dirs(str(path.parent))
                with layout.private_open(str(path), "wb") as f:
                    f.write(data)
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

    async def start_agent(self, agent_dir: str, python: str, mode: dict | None = None) -> AgentChannel:
        try:
            header = agent_stdin_header(python, agent_dir, self.node.name, mode)
        except ValueError as exc:
            raise NodeUnreachable(f"{self.node.name}: {exc}") from None
        try:
            proc = await self._spawn(agent_argv())
        except OSError as exc:
            raise NodeUnreachable(f"{self.node.name}: the agent did not start with {python}: {exc}") from None
        channel = LocalChannel(proc)
        try:
            await channel._write(header)
        except (OSError, RuntimeError):
            pass  # it is gone already: the caller sees its output end, and its stderr says why
        return channel

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

    async def fetch_run_dir(
        self,
        remote: str,
        local: str,
        logs_root: str | None = None,
        include: tuple[str, ...] = (),
        progress: Progress | None = None,
    ) -> int:
        dest = self._fetch_dest(local, logs_root)
        self._check_run_dir(remote)
        try:
            fd = os.open(remote, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return 0
        except OSError:
            if os.path.islink(remote):
                return 0  # the run folder itself is a link: not followed
            raise
        try:
            private_folders(logs_root, dest)
            # In a thread: a large run folder must not hold up the loop (other nodes, the views).
            return await asyncio.to_thread(_copy_tree, fd, dest, layout.not_fetched(include), progress)
        finally:
            os.close(fd)

    async def holds_run(self, run_id: str) -> bool:
        return os.path.lexists(self.run_dir(run_id))

    async def close(self) -> None:
        return None


def _copy_tree(src_fd: int, dest: Path, skip: frozenset[str], progress: Progress | None) -> int:
    """Copy the run folder open as ``src_fd`` into ``dest``, as layout.fetched_entries walks it;
    the bytes copied."""
    total = 0
    for path, fd in layout.fetched_entries(src_fd, skip=skip):
        target = within(dest, path)
        if fd is None:
            private_subfolder(target)
            continue
        out_fd = private_file(target)  # 0600 whatever the umask, never through a link
        with os.fdopen(os.dup(fd), "rb") as src, os.fdopen(out_fd, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
                total += len(chunk)
                if progress is not None:
                    progress(len(chunk))
    return total
