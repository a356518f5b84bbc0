"""SSH nodes through asyncssh: one connection per node, SFTP for files, one exec channel for the agent.

Host keys are checked against known_hosts by default, exactly as ``ssh`` does; agent forwarding
is never requested; the remote command line is built from quoted words only.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from ..bundle import AGENT_PACKAGE, AgentBundle, WorkdirArchive, agent_argv
from ..inventory import Inventory, NodeSpec
from .base import AgentChannel, NodeTransport, NodeUnreachable


@dataclass(frozen=True, slots=True)
class SshOptions:
    accept_new_host_keys: bool = False  # like StrictHostKeyChecking=accept-new; changed keys still fail
    connect_semaphore: asyncio.Semaphore | None = None


class SshChannel(AgentChannel):
    def __init__(self, proc: asyncssh.SSHClientProcess) -> None:
        self.proc = proc
        self._stderr = ""
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        try:
            while chunk := await self.proc.stderr.read(65536):
                self._stderr = (self._stderr + chunk)[-8192:]
        except (asyncssh.Error, OSError):
            pass

    async def _write(self, data: str) -> None:
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def _readline(self) -> str:
        try:
            return await self.proc.stdout.readline()
        except (asyncssh.Error, OSError, asyncio.IncompleteReadError):
            return ""

    async def close(self, wait_s: float = 10.0) -> None:
        try:
            self.proc.stdin.write_eof()
        except (asyncssh.Error, OSError, BrokenPipeError):
            pass
        try:
            await asyncio.wait_for(self.proc.wait_closed(), wait_s)
        except (TimeoutError, asyncssh.Error, OSError):
            self.proc.close()  # closing the channel: the agent sees EOF and stops its ranks
        self._stderr_task.cancel()

    def stderr_tail(self) -> str:
        return self._stderr


class SshTransport(NodeTransport):
    def __init__(self, node: NodeSpec, inv: Inventory, options: SshOptions) -> None:
        super().__init__(node)
        self.inv = inv
        self.options = options
        self.conn: asyncssh.SSHClientConnection | None = None
        self.sftp: asyncssh.SFTPClient | None = None

    @property
    def _where(self) -> str:
        port = f":{self.node.port}" if self.node.port else ""
        return f"{self.node.name} ({self.node.host}{port})"

    def _known_hosts_path(self) -> str:
        return self.inv.ssh.known_hosts or os.path.expanduser("~/.ssh/known_hosts")

    def _connect_kwargs(self) -> dict:
        kw: dict = {
            "known_hosts": self._known_hosts_path(),
            "agent_forwarding": False,
            "x11_forwarding": False,
            "connect_timeout": self.inv.ssh.connect_timeout_s,
            "keepalive_interval": self.inv.ssh.keepalive_interval_s,
            "keepalive_count_max": 3,
        }
        if self.inv.ssh.config:
            kw["config"] = [self.inv.ssh.config]
        # Only what the inventory sets; the rest comes from ~/.ssh/config as with `ssh HOST`.
        if self.node.port:
            kw["port"] = self.node.port
        if self.node.user:
            kw["username"] = self.node.user
        if self.node.identity_file:
            kw["client_keys"] = [self.node.identity_file]
        return kw

    async def connect(self) -> None:
        sem = self.options.connect_semaphore
        if sem is None:
            await self._connect()
        else:
            async with sem:  # sshd's MaxStartups drops bursts of unauthenticated connections
                await self._connect()

    async def _connect(self) -> None:
        try:
            try:
                self.conn = await asyncssh.connect(self.node.host, **self._connect_kwargs())
            except asyncssh.HostKeyNotVerifiable:
                if not self.options.accept_new_host_keys or self._host_is_known():
                    raise
                await self._learn_host_key()
                self.conn = await asyncssh.connect(self.node.host, **self._connect_kwargs())
            self.sftp = await self.conn.start_sftp_client()
            self.home = await self.sftp.realpath(".")
        except asyncssh.HostKeyNotVerifiable:
            if self._host_is_known():
                raise NodeUnreachable(
                    f"{self._where}: HOST KEY MISMATCH: the server's key differs from the one in "
                    f"{self._known_hosts_path()}; refusing to connect (possible man-in-the-middle). "
                    "If the host was reinstalled, remove its old entry (ssh-keygen -R HOST)."
                ) from None
            raise NodeUnreachable(
                f"{self._where}: unknown host key (no entry in {self._known_hosts_path()}); "
                "verify it and add it (ssh-keyscan), or pass --accept-new-host-keys"
            ) from None
        except asyncssh.PermissionDenied as exc:
            raise NodeUnreachable(f"{self._where}: authentication failed: {exc.reason}") from None
        except TimeoutError:
            raise NodeUnreachable(
                f"{self._where}: connect timed out after {self.inv.ssh.connect_timeout_s:g} s"
            ) from None
        except (OSError, asyncssh.Error) as exc:
            reason = getattr(exc, "reason", None) or exc.strerror if isinstance(exc, OSError) else None
            raise NodeUnreachable(f"{self._where}: cannot connect: {reason or exc}") from None

    def _resolved(self) -> tuple[str, int]:
        """(host, port) after ~/.ssh/config (HostName, Port, HostKeyAlias): what known_hosts is keyed by."""
        kw = {k: v for k, v in self._connect_kwargs().items() if k in ("config", "port", "username")}
        try:
            opts = asyncssh.SSHClientConnectionOptions(host=self.node.host, **kw)
        except (OSError, ValueError, asyncssh.Error):
            return self.node.host, self.node.port or 22
        return (opts.host_key_alias or opts.host or self.node.host), int(opts.port or 22)

    def _host_is_known(self) -> bool:
        path = self._known_hosts_path()
        if not os.path.exists(path):
            return False
        try:
            kh = asyncssh.read_known_hosts(path)
        except (OSError, ValueError):
            return False
        host, port = self._resolved()
        host_keys, ca_keys, *_ = kh.match(host, "", port)
        return bool(host_keys or ca_keys)

    async def _learn_host_key(self) -> None:
        host, port = self._resolved()
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(host, port=port), self.inv.ssh.connect_timeout_s
        )
        if key is None:
            raise NodeUnreachable(f"{self._where}: the server offered no host key")
        host = host if port == 22 else f"[{host}]:{port}"
        path = Path(self._known_hosts_path())
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(f"{host} {key.export_public_key().decode().strip()}\n")

    def _require(self) -> tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient]:
        if self.conn is None or self.sftp is None:
            raise NodeUnreachable(f"{self._where}: not connected")
        return self.conn, self.sftp

    async def _put_atomic(self, remote: str, data: bytes) -> None:
        _, sftp = self._require()
        # Unique per writer: nodes may share one home directory (NFS) and upload the same file at once.
        tmp = f"{remote}.tmp-{self.node.name}-{secrets.token_hex(4)}"
        async with sftp.open(tmp, "wb") as f:
            await f.write(data)
        try:
            await sftp.posix_rename(tmp, remote)
        except asyncssh.SFTPError:
            await sftp.rename(tmp, remote)
        finally:
            if await sftp.exists(tmp):
                await sftp.remove(tmp)

    async def ensure_agent(self, bundle: AgentBundle) -> str:
        _, sftp = self._require()
        root = posixpath.join(self.cache_root, bundle.dirname)
        pkg = posixpath.join(root, AGENT_PACKAGE)
        marker = posixpath.join(pkg, ".complete")
        try:
            if await sftp.exists(marker):
                return root  # same content hash: already deployed
            await sftp.makedirs(pkg, exist_ok=True)
            for name, data in bundle.files.items():
                await self._put_atomic(posixpath.join(pkg, name), data)
            await self._put_atomic(marker, bundle.digest.encode())
        except (OSError, asyncssh.Error) as exc:
            raise NodeUnreachable(f"{self._where}: cannot deploy the agent: {exc}") from None
        return root

    async def upload_workdir(self, archive: WorkdirArchive) -> str:
        _, sftp = self._require()
        folder = posixpath.join(self.cache_root, "sync")
        remote = posixpath.join(folder, archive.filename)
        try:
            if not await sftp.exists(remote):
                await sftp.makedirs(folder, exist_ok=True)
                await self._put_atomic(remote, archive.data)
        except (OSError, asyncssh.Error) as exc:
            raise NodeUnreachable(f"{self._where}: cannot upload the workdir: {exc}") from None
        return remote

    async def start_agent(self, agent_dir: str, python: str) -> AgentChannel:
        conn, _ = self._require()
        words = agent_argv(python, agent_dir, self.node.name)
        command = " ".join(shlex.quote(w) for w in words)  # the remote login shell sees quoted words only
        try:
            proc = await conn.create_process(command, encoding="utf-8", errors="replace")
        except (OSError, asyncssh.Error) as exc:
            raise NodeUnreachable(f"{self._where}: cannot start the agent: {exc}") from None
        return SshChannel(proc)

    async def fetch_run_dir(self, remote: str, local: str) -> None:
        _, sftp = self._require()
        os.makedirs(local, exist_ok=True)
        for entry in await sftp.readdir(remote):
            name = str(entry.filename)
            if name in (".", "..", "work"):
                continue
            await sftp.get(posixpath.join(remote, name), local, recurse=True, preserve=False)

    async def close(self) -> None:
        if self.sftp is not None:
            self.sftp.exit()
        if self.conn is not None:
            self.conn.close()
            try:
                await asyncio.wait_for(self.conn.wait_closed(), 5)
            except (TimeoutError, asyncssh.Error, OSError):
                pass
