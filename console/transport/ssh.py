"""SSH nodes through asyncssh: one connection per node, SFTP for files, one exec channel for the agent.

Host keys are checked against known_hosts by default, exactly as ``ssh`` does (a missing file is
explained; ``accept_new_host_keys`` creates it and records first-seen keys; a changed key is always
refused); agent forwarding is never requested. The remote command is one fixed string with no
inventory value in it (``bundle.AGENT_COMMAND``); the python path and node name go over stdin.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import secrets
from dataclasses import dataclass
from pathlib import Path

import asyncssh
from mscon.agent import layout
from mscon.console.config.inventory import Inventory, NodeSpec, SshSpec
from mscon.console.config.safepath import is_plain_name, remote_within, within
from mscon.console.transport.base import AgentChannel, NodeTransport, NodeUnreachable
from mscon.console.transport.bundle import (
    AGENT_PACKAGE,
    AgentBundle,
    WorkdirArchive,
    agent_command,
    agent_stdin_header,
)

_FETCH_PARALLEL = 8  # files copied back at once
PREFERRED_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)
_DEFAULT_CIPHERS = tuple(a.encode() for a in PREFERRED_CIPHERS)


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

    def _stderr_raw(self) -> str:
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
        return os.path.expanduser(self.inv.ssh.known_hosts or "~/.ssh/known_hosts")

    def _keepalive_s(self) -> float:
        ssh = self.inv.ssh
        old_name = getattr(ssh, "keepalive_interval_s", SshSpec.keepalive_s)
        return float(getattr(ssh, "keepalive_s", None) or old_name)

    def _connect_kwargs(self) -> dict:
        kw: dict = {
            "known_hosts": self._known_hosts_path(),
            "agent_forwarding": False,
            "x11_forwarding": False,
            "connect_timeout": self.inv.ssh.connect_timeout_s,
            # One unanswered keepalive ends the connection: a vanished node is noticed within two
            # intervals, not four.
            "keepalive_interval": self._keepalive_s(),
            "keepalive_count_max": 1,
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
        kh = self._known_hosts_path()
        try:
            if not os.path.exists(kh):
                if not self.options.accept_new_host_keys:
                    host, port = self._resolved()
                    raise NodeUnreachable(
                        f"{self._where}: no known host keys yet ({kh} does not exist): verify the host "
                        f"key and add it (ssh-keyscan -p {port} {host} >> {kh}), "
                        "or pass --accept-new-host-keys"
                    )
                await self._learn_host_key()  # creates the file (and its folder)
            kwargs = {**self._connect_kwargs(), **self._ciphers()}
            try:
                self.conn = await asyncssh.connect(self.node.host, **kwargs)
            except asyncssh.HostKeyNotVerifiable:
                if not self.options.accept_new_host_keys or self._host_is_known():
                    raise
                await self._learn_host_key()
                self.conn = await asyncssh.connect(self.node.host, **kwargs)
            try:
                self.sftp = await self.conn.start_sftp_client()
            except asyncssh.ChannelOpenError as exc:
                # Connected and authenticated, but the subsystem request was refused: asyncssh only
                # says "Session request failed", which reads like a network problem.
                raise NodeUnreachable(
                    f"{self._where}: the SSH server has no SFTP subsystem (Subsystem sftp in sshd_config; "
                    f"the server said: {exc.reason})"
                ) from None
            home = await self.sftp.realpath(".")
        except asyncssh.HostKeyNotVerifiable:
            if self._host_is_known():
                raise NodeUnreachable(
                    f"{self._where}: HOST KEY MISMATCH: the server's key differs from the one in "
                    f"{kh}; refusing to connect (possible man-in-the-middle). "
                    "If the host was reinstalled, remove its old entry (ssh-keygen -R HOST)."
                ) from None
            host, port = self._resolved()
            raise NodeUnreachable(
                f"{self._where}: unknown host key (no entry in {kh}); verify it and add it "
                f"(ssh-keyscan -p {port} {host} >> {kh}), or pass --accept-new-host-keys"
            ) from None
        except asyncssh.PermissionDenied as exc:
            raise NodeUnreachable(f"{self._where}: authentication failed: {exc.reason}") from None
        except TimeoutError:
            raise NodeUnreachable(
                f"{self._where}: connect timed out after {self.inv.ssh.connect_timeout_s:g} s"
            ) from None
        except (OSError, asyncssh.Error) as exc:
            reason = getattr(exc, "reason", None) or exc.strerror if isinstance(exc, OSError) else None
            if isinstance(exc, OSError) and exc.errno and str(reason).startswith("Connect call failed"):
                reason = os.strerror(exc.errno)  # asyncio's words for a refusal name no reason
            raise NodeUnreachable(f"{self._where}: cannot connect: {reason or exc}") from None
        # Every remote path is built under the home the server reports: it must be a plain
        # absolute path, or a hostile server could steer uploads and fetches elsewhere.
        if not home.startswith("/") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in home):
            raise NodeUnreachable(f"{self._where}: the server reported an unusable home folder {home!r}")
        self.home = posixpath.normpath(home)

    def _config_options(self) -> asyncssh.SSHClientConnectionOptions | None:
        """What ~/.ssh/config (or the inventory's ssh config) says for this node, as ``ssh`` reads it;
        None when it cannot be read (connect then says why)."""
        kw = {k: v for k, v in self._connect_kwargs().items() if k in ("config", "port", "username")}
        try:
            return asyncssh.SSHClientConnectionOptions(host=self.node.host, **kw)
        except (OSError, ValueError, asyncssh.Error):
            return None

    def _resolved(self) -> tuple[str, int]:
        """(host, port) after ~/.ssh/config (HostName, Port, HostKeyAlias): what known_hosts is keyed by."""
        opts = self._config_options()
        if opts is None:
            return self.node.host, self.node.port or 22
        return (opts.host_key_alias or opts.host or self.node.host), int(opts.port or 22)

    def resolved_host(self) -> str:
        opts = self._config_options()
        return str(opts.host or self.node.host) if opts is not None else self.node.host

    def _ciphers(self) -> dict:
        """AES-GCM first where nobody chose the ciphers (no ``Ciphers`` in the ssh config): asyncssh's
        own first choice, ChaCha20-Poly1305, costs the console about 45 % more CPU per packet (two
        cipher objects per packet, in Python; AES-GCM is one call on AES-NI), and the console handles
        every node's packets. The same algorithms as asyncssh's defaults, in another order."""
        opts = self._config_options()
        if opts is None or set(opts.encryption_algs) != set(_DEFAULT_CIPHERS):
            return {}  # chosen in the ssh config: as chosen
        return {"encryption_algs": list(PREFERRED_CIPHERS)}

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
        """Record the server's current key (``--accept-new-host-keys``), creating the file with mode
        0600 (and its folder with mode 0700) when they do not exist yet."""
        host, port = self._resolved()
        try:
            key = await asyncio.wait_for(
                asyncssh.get_server_host_key(host, port=port), self.inv.ssh.connect_timeout_s
            )
        except TimeoutError:
            raise  # reported as a connect timeout
        except (OSError, asyncssh.Error) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise NodeUnreachable(f"{self._where}: cannot connect: {reason}") from None
        if key is None:
            raise NodeUnreachable(f"{self._where}: the server offered no host key")
        entry = host if port == 22 else f"[{host}]:{port}"
        line = f"{entry} {key.export_public_key().decode().strip()}\n"
        path = Path(self._known_hosts_path())
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(path.parent, 0o700)
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = "\n" + line  # never glue the new entry onto an unterminated last line
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise NodeUnreachable(f"{self._where}: cannot record the host key in {path}: {exc}") from None

    def _require(self) -> tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient]:
        if self.conn is None or self.sftp is None:
            raise NodeUnreachable(f"{self._where}: not connected")
        return self.conn, self.sftp

    async def _put_atomic(self, remote: str, data: bytes) -> None:
        _, sftp = self._require()
        # Unique per writer: nodes may share one home directory (NFS) and upload the same file at once.
        # Random only: no inventory value (a node name) ever becomes part of a remote path here.
        tmp = f"{remote}.tmp-{secrets.token_hex(8)}"
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
        root = remote_within(self.cache_root, bundle.dirname)
        pkg = remote_within(root, AGENT_PACKAGE)
        marker = remote_within(pkg, ".complete")
        try:
            if await sftp.exists(marker):
                return root  # same content hash: already deployed
            # Each file's path checked part by part (sub-packages: "checks/gpu.py"), then every
            # folder made once, parents first, before any file goes up.
            files = {remote_within(pkg, name): data for name, data in bundle.files.items()}
            for folder in sorted({pkg, *(posixpath.dirname(path) for path in files)}):
                await sftp.makedirs(folder, exist_ok=True)
            for path, data in files.items():
                await self._put_atomic(path, data)
            await self._put_atomic(marker, bundle.digest.encode())
        except (OSError, asyncssh.Error) as exc:
            raise NodeUnreachable(f"{self._where}: cannot deploy the agent: {exc}") from None
        return root

    async def upload_workdir(self, archive: WorkdirArchive) -> str:
        _, sftp = self._require()
        folder = remote_within(self.cache_root, layout.SYNC_DIR)
        remote = remote_within(folder, archive.filename)
        try:
            if not await sftp.exists(remote):
                await sftp.makedirs(folder, exist_ok=True)
                await self._put_atomic(remote, archive.data)
        except (OSError, asyncssh.Error) as exc:
            raise NodeUnreachable(f"{self._where}: cannot upload the workdir: {exc}") from None
        return remote

    async def start_agent(self, agent_dir: str, python: str, mode: dict | None = None) -> AgentChannel:
        conn, _ = self._require()
        try:
            header = agent_stdin_header(python, agent_dir, self.node.name, mode)
        except ValueError as exc:
            raise NodeUnreachable(f"{self._where}: {exc}") from None
        try:
            # The same fixed command for every node: no value of the inventory is in it, so no
            # login shell (sh, bash, zsh, fish, csh) can misread one; they follow on stdin.
            proc = await conn.create_process(agent_command(), encoding="utf-8", errors="replace")
        except (OSError, asyncssh.Error) as exc:
            raise NodeUnreachable(f"{self._where}: cannot start the agent: {exc}") from None
        channel = SshChannel(proc)
        try:
            await channel._write(header)
        except (OSError, asyncssh.Error):
            pass  # it is gone already: the caller sees its output end, and its stderr says why
        return channel

    async def fetch_run_dir(self, remote: str, local: str, logs_root: str | None = None) -> None:
        dest = self._fetch_dest(local, logs_root)  # refused before anything is written
        self._check_run_dir(remote)
        _, sftp = self._require()
        try:
            attrs = await sftp.lstat(remote)
        except asyncssh.SFTPNoSuchFile:
            return
        if attrs.type != asyncssh.FILEXFER_TYPE_DIRECTORY:
            return  # not a folder, or a link to one: not followed
        dest.mkdir(parents=True, exist_ok=True)
        files: list[tuple[str, Path]] = []
        await self._list_tree(sftp, remote, dest, files, top=True)
        sem = asyncio.Semaphore(_FETCH_PARALLEL)

        async def get(src: str, target: Path) -> None:
            async with sem:
                if target.is_symlink():
                    target.unlink()  # never write through a link in the destination
                try:
                    await sftp.get(src, str(target), preserve=False, follow_symlinks=False)
                except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPBadMessage):
                    pass  # gone meanwhile, or turned into a link pointing out of the tree

        await asyncio.gather(*(get(src, target) for src, target in files))

    async def _list_tree(
        self, sftp: asyncssh.SFTPClient, remote: str, dest: Path, files: list[tuple[str, Path]], top: bool
    ) -> None:
        """Folders under ``remote`` (created under ``dest``) and the regular files to copy. Names the
        node lists are used only when they are plain names; links are skipped, never followed."""
        for entry in await sftp.readdir(remote):
            name = entry.filename
            if isinstance(name, bytes):
                try:
                    name = name.decode("utf-8")
                except UnicodeDecodeError:
                    continue
            if (top and name == layout.WORK_DIR) or not is_plain_name(name):
                continue  # the synced workdir is not a log; "..", "a/b" and odd names never are
            kind = entry.attrs.type
            if kind == asyncssh.FILEXFER_TYPE_DIRECTORY:
                sub = within(dest, name)
                sub.mkdir(exist_ok=True)
                await self._list_tree(sftp, remote_within(remote, name), sub, files, top=False)
            elif kind == asyncssh.FILEXFER_TYPE_REGULAR:
                files.append((remote_within(remote, name), within(dest, name)))

    async def close(self) -> None:
        if self.sftp is not None:
            self.sftp.exit()
        if self.conn is not None:
            self.conn.close()
            try:
                await asyncio.wait_for(self.conn.wait_closed(), 5)
            except (TimeoutError, asyncssh.Error, OSError):
                pass
