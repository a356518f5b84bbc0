"""SSH nodes through asyncssh: one connection per node, SFTP for files, one exec channel for the agent.

Host keys are checked in the files ``ssh`` would read (``host_keys.py``), for the node and for each
ProxyJump host on its way; ``accept_new_host_keys`` records a first-seen key over that same route,
and a changed key is always refused. Agent forwarding is never requested. The remote command is one
fixed string with no inventory value in it (``bundle.AGENT_COMMAND``); the python path and node name
go over stdin.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import asyncssh
from mscon.agent import layout
from mscon.console.config import named_files, ssh_includes
from mscon.console.config.inventory import Inventory, NodeSpec, SshSpec
from mscon.console.config.limits import MAX_KEY_FILE_BYTES, MAX_KNOWN_HOSTS_BYTES
from mscon.console.config.safepath import is_plain_name, remote_within, within
from mscon.console.transport import reach
from mscon.console.transport.base import (
    AgentChannel,
    NodeTransport,
    NodeUnreachable,
    Progress,
    TransportKind,
)
from mscon.console.transport.bundle import (
    AGENT_PACKAGE,
    AgentBundle,
    WorkdirArchive,
    agent_command,
    agent_stdin_header,
)
from mscon.console.transport.host_keys import HostKeyCheck, Target, config_paths, host_key_files
from mscon.console.transport.private_copy import (
    made_private,
    private_file,
    private_folders,
    private_subfolder,
)

_FETCH_PARALLEL = 8  # files copied back at once
_MAX_JUMPS = 8  # nested ProxyJump lists followed (a config can loop)
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


@dataclass(frozen=True)
class _Route:
    """One connection to make: to the node or to one of its jump hosts."""

    host: str  # as given: an ssh config alias or a name
    kwargs: dict
    who: str  # how errors name it
    opts: asyncssh.SSHClientConnectionOptions  # what the ssh config says for it
    target: Target
    check: HostKeyCheck


def _refuse_unreadable(who: str, paths: Iterable[object], max_bytes: int) -> None:
    """NodeUnreachable for the first of ``paths`` (keys, known-hosts files, ssh configs) that is not
    a regular file of at most ``max_bytes``: asyncssh would read a /dev/zero key until memory ran
    out, and wait on a FIFO for ever. Missing ones are left to asyncssh, as ssh skips them."""
    for path in paths:
        if isinstance(path, str | os.PathLike):
            why = named_files.problem(path, max_bytes, missing_ok=True)
            if why is not None:
                raise NodeUnreachable(f"{who}: {why}")


def _parse_jump(hop: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` (``[v6addr]:port`` too) from a ProxyJump list."""
    hop = hop.strip().removeprefix("ssh://")
    user, _, host = hop.rpartition("@")
    port: int | None = None
    if host.startswith("[") and "]" in host:
        host, _, rest = host[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    elif host.count(":") == 1:
        host, _, text = host.partition(":")
        port = int(text) if text.isdigit() else None
    return user or None, host, port


def ssh_line_ready(reader: asyncssh.SSHReader) -> bool:
    """``AgentChannel._line_ready`` of an SSH channel's stdout: asyncssh has no peek, so its
    session's receive buffer is looked at (a list of str chunks and the exceptions to raise, in
    2.14 to 2.24); False where it is not what it was (the messages then come one at a time)."""
    try:
        chunks = reader._session._recv_buf[reader._datatype]  # noqa: SLF001
    except (AttributeError, KeyError, TypeError):
        return False
    for chunk in chunks:
        if not isinstance(chunk, str):
            return False  # an exception or EOF next: readline deals with it
        if "\n" in chunk:
            return True
    return False


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

    def send_now(self, line: str) -> bool:
        self.proc.stdin.write(line)
        return True

    def _line_ready(self) -> bool:
        return ssh_line_ready(self.proc.stdout)

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
    kind = TransportKind.SSH

    def __init__(self, node: NodeSpec, inv: Inventory, options: SshOptions) -> None:
        super().__init__(node)
        self.inv = inv
        self.options = options
        self.conn: asyncssh.SSHClientConnection | None = None
        self.sftp: asyncssh.SFTPClient | None = None
        self._hops: list[asyncssh.SSHClientConnection] = []  # ProxyJump hosts, first to last

    @property
    def _where(self) -> str:
        port = f":{self.node.port}" if self.node.port else ""
        return f"{self.node.name} ({self.node.host}{port})"

    def _keepalive_s(self) -> float:
        ssh = self.inv.ssh
        old_name = getattr(ssh, "keepalive_interval_s", SshSpec.keepalive_s)
        return float(getattr(ssh, "keepalive_s", None) or old_name)

    def _base_kwargs(self) -> dict:
        """What every connection of this node gets, jump hosts included; host keys are not set here
        (``_open`` always passes its own check: no config may turn it off)."""
        kw: dict = {
            "agent_forwarding": False,
            "x11_forwarding": False,
            "connect_timeout": self.inv.ssh.connect_timeout_s,
            # One unanswered keepalive ends the connection: a vanished node is noticed within two
            # intervals, not four.
            "keepalive_interval": self._keepalive_s(),
            "keepalive_count_max": 1,
        }
        # The files `ssh HOST` reads (the inventory's ssh.config alone, else the user's then the
        # system's), named here: asyncssh's options read no config unless told, so a ProxyJump in
        # ~/.ssh/config would be missed by the route while the connection itself honoured HostName.
        kw["config"] = config_paths(self.inv.ssh.config)
        return kw

    def _connect_kwargs(self) -> dict:
        kw = self._base_kwargs()
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
        kwargs = {**self._connect_kwargs(), **self._ciphers()}
        try:
            route = self._route(self.node.host, kwargs, self._where)
            self._refuse_early(route)  # before any hop is opened
            via = await self._jumps(route.opts.tunnel, 0)
            self.conn = await self._open(route, via)
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
        except NodeUnreachable:
            await self.close()
            raise
        except (TimeoutError, OSError, asyncssh.Error) as exc:
            await self.close()
            raise self._unreachable(self._where, exc) from None
        # Every remote path is built under the home the server reports: it must be a plain
        # absolute path, or a hostile server could steer uploads and fetches elsewhere.
        if not home.startswith("/") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in home):
            raise NodeUnreachable(f"{self._where}: the server reported an unusable home folder {home!r}")
        self.home = posixpath.normpath(home)

    def _unreachable(self, who: str, exc: BaseException) -> NodeUnreachable:
        """One line for a failed connection (to the node, or to a jump host on the way)."""
        if isinstance(exc, asyncssh.PermissionDenied):
            return NodeUnreachable(f"{who}: authentication failed: {exc.reason}")
        if isinstance(exc, TimeoutError):
            return NodeUnreachable(f"{who}: connect timed out after {self.inv.ssh.connect_timeout_s:g} s")
        reason = getattr(exc, "reason", None) or exc.strerror if isinstance(exc, OSError) else None
        if isinstance(exc, OSError) and exc.errno and str(reason).startswith("Connect call failed"):
            reason = os.strerror(exc.errno)  # asyncio's words for a refusal name no reason
        if reason is None:
            reason = getattr(exc, "reason", None)
        return NodeUnreachable(f"{who}: cannot connect: {reason or exc}")

    def _route(self, host: str, kwargs: dict, who: str) -> _Route:
        """What the ssh config says about ``host`` (HostName, Port, User, ProxyJump) and where its
        host keys are looked up; the key and known-hosts files it names checked before any is read."""
        why = ssh_includes.problem(kwargs.get("config") or (), MAX_KEY_FILE_BYTES)  # and their Includes
        if why is not None:
            raise NodeUnreachable(f"{who}: {why}")
        keys = ("config", "port", "username")
        try:
            opts = asyncssh.SSHClientConnectionOptions(
                host=host, client_keys=None, **{k: v for k, v in kwargs.items() if k in keys}
            )
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise NodeUnreachable(f"{who}: cannot read the ssh config: {exc}") from None
        target = Target(
            alias=host,
            hostname=str(opts.host or host),
            port=int(opts.port or 22),
            user=str(opts.username),
            host_key_alias=opts.host_key_alias,
        )
        try:
            files = host_key_files(target, config_paths(self.inv.ssh.config), self.inv.ssh.known_hosts)
        except ValueError as exc:
            raise NodeUnreachable(f"{who}: {exc}") from None
        _refuse_unreadable(who, files.existing(), MAX_KNOWN_HOSTS_BYTES)
        given = kwargs.get("client_keys")  # the inventory's identity_file, else the config's
        keys = given or [os.path.expanduser(str(k)) for k in opts.config.get("IdentityFile") or ()]
        _refuse_unreadable(who, keys, MAX_KEY_FILE_BYTES)
        check = HostKeyCheck(files, self.options.accept_new_host_keys)
        return _Route(host, kwargs, who, opts, target, check)

    @staticmethod
    def _refuse_early(route: _Route) -> None:
        """Through a jump host or a ProxyCommand: no known-hosts file at all is said before any hop
        is opened. A direct connection goes in ssh's order instead (``_open``): the name resolves,
        the port answers as an SSH server, then the host key is checked."""
        direct = not route.opts.tunnel and not route.opts.proxy_command
        if direct:
            return
        early = route.check.missing_files(route.target, direct)
        if early is not None:
            raise NodeUnreachable(f"{route.who}: {early}")

    async def _jumps(self, spec: object, depth: int) -> asyncssh.SSHClientConnection | None:
        """The connection to the last jump host of a ``ProxyJump`` list (None: none), each hop's
        host key checked exactly as the node's (and learned only with --accept-new-host-keys). The
        first hop's own ProxyJump is followed, as ssh does; later hops go through the one before."""
        if not isinstance(spec, str) or not spec or spec.lower() == "none":
            return None
        if depth >= _MAX_JUMPS:
            raise NodeUnreachable(f"{self._where}: ProxyJump chains deeper than {_MAX_JUMPS} (a loop?)")
        via: asyncssh.SSHClientConnection | None = None
        for i, hop in enumerate(spec.split(",")):
            user, host, port = _parse_jump(hop)
            kwargs = self._base_kwargs()
            if port:
                kwargs["port"] = port
            if user:
                kwargs["username"] = user
            route = self._route(host, kwargs, f"{self._where}: jump host {hop.strip()}")
            self._refuse_early(route)
            if i == 0:
                via = await self._jumps(route.opts.tunnel, depth + 1)
            try:
                via = await self._open(route, via)
            except (TimeoutError, OSError, asyncssh.Error) as exc:
                raise self._unreachable(route.who, exc) from None
            self._hops.append(via)
        return via

    async def _open(
        self, route: _Route, via: asyncssh.SSHClientConnection | None
    ) -> asyncssh.SSHClientConnection:
        """One SSH connection, through ``via`` when given (never through a ProxyJump asyncssh would
        open itself: its hops would be checked against asyncssh's defaults, not these files)."""
        check = route.check
        direct = via is None and not route.opts.proxy_command
        timeout_s = float(self.inv.ssh.connect_timeout_s)
        if direct:  # ssh's first step: the name (a jump host or a ProxyCommand resolves its own)
            await reach.resolve(route.who, route.target.hostname, route.target.port, timeout_s)
        watch = reach.BannerWatch()
        try:
            return await asyncssh.connect(
                route.host,
                known_hosts=check.lookup,
                client_factory=watch.client(check.client_factory()),
                tunnel=via,
                **route.kwargs,
            )
        except asyncssh.HostKeyNotVerifiable:
            raise NodeUnreachable(f"{route.who}: {check.refused(route.target, direct)}") from None
        except asyncssh.KeyExchangeFailed as exc:
            if check.lookup.known and "server host key" in str(exc.reason):
                # Known with another key type only: asyncssh offers just the recorded types.
                raise NodeUnreachable(f"{route.who}: {check.refused(route.target, direct)}") from None
            raise
        except asyncssh.PermissionDenied as exc:
            raise NodeUnreachable(f"{route.who}: {self._auth_refused(route, exc)}") from None
        except (TimeoutError, OSError, asyncssh.Error) as exc:
            banner = watch.banner_error(route.who, exc, timeout_s)  # it answered, but not as SSH
            if banner is not None:
                raise banner from None
            raise

    @staticmethod
    def _auth_refused(route: _Route, exc: asyncssh.PermissionDenied) -> str:
        given = route.kwargs.get("client_keys")  # the inventory's identity_file, else the config's
        named = given or route.opts.config.get("IdentityFile") or ()
        t = route.target
        return reach.auth_refused(t.user, t.hostname, t.port, [str(k) for k in named], str(exc.reason))

    def _config_options(self) -> asyncssh.SSHClientConnectionOptions | None:
        """What ~/.ssh/config (or the inventory's ssh config) says for this node, as ``ssh`` reads it;
        None when it cannot be read (connect then says why)."""
        kw = {k: v for k, v in self._connect_kwargs().items() if k in ("config", "port", "username")}
        if ssh_includes.problem(kw["config"], MAX_KEY_FILE_BYTES) is not None:
            return None  # connecting says why, through _route
        try:
            # client_keys None: only the config is wanted, no key file is read here.
            return asyncssh.SSHClientConnectionOptions(host=self.node.host, client_keys=None, **kw)
        except (OSError, ValueError, asyncssh.Error):
            return None

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

    def _require(self) -> tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient]:
        if self.conn is None or self.sftp is None:
            raise NodeUnreachable(f"{self._where}: not connected")
        return self.conn, self.sftp

    async def _put_atomic(self, remote: str, data: bytes | Iterable[bytes]) -> None:
        """Write ``data`` (or its pieces, one after the other) to ``remote``, atomically."""
        _, sftp = self._require()
        # Unique per writer: nodes may share one home directory (NFS) and upload the same file at once.
        # Random only: no inventory value (a node name) ever becomes part of a remote path here.
        tmp = f"{remote}.tmp-{secrets.token_hex(8)}"
        # 0600 as it is made (the open's attributes: the node's umask can only take bits away), and
        # set again whatever the umask or a server that ignores them: that chmod goes out ahead of
        # the first write, in the same round trip, so no content is ever in a file open to others.
        async with sftp.open(tmp, "wb", asyncssh.SFTPAttrs(permissions=layout.PRIVATE_FILE)) as f:
            first = [f.chmod(layout.PRIVATE_FILE)]
            for piece in [data] if isinstance(data, bytes) else data:
                await asyncio.gather(*first, f.write(piece))  # in order: the chmod is sent first
                first = []
            await asyncio.gather(*first)
        try:
            await sftp.posix_rename(tmp, remote)
        except asyncssh.SFTPError:
            await sftp.rename(tmp, remote)
        finally:
            if await sftp.exists(tmp):
                await sftp.remove(tmp)

    async def _private_folders(self, folders: list[str]) -> None:
        """Each of ``folders`` (the node user's mscon folder, or in it) 0700 where it is not yet:
        made by an older mscon or under another umask. One round trip for every look, one for
        every change."""
        _, sftp = self._require()
        found = await asyncio.gather(*(sftp.stat(folder) for folder in folders))
        loose = [
            folder
            for folder, attrs in zip(folders, found, strict=True)
            if attrs.permissions is not None and attrs.permissions & 0o7777 != layout.PRIVATE_DIR
        ]
        await asyncio.gather(*(sftp.chmod(folder, layout.PRIVATE_DIR) for folder in loose))

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
            folders = sorted({pkg, *(posixpath.dirname(path) for path in files)})
            for folder in folders:  # 0700, each level made (~/.cache/mscon, agent-<digest>/, ...)
                await sftp.makedirs(folder, asyncssh.SFTPAttrs(permissions=layout.PRIVATE_DIR), exist_ok=True)
            await self._private_folders([self.cache_root, root, *folders])
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
                await sftp.makedirs(folder, asyncssh.SFTPAttrs(permissions=layout.PRIVATE_DIR), exist_ok=True)
                await self._private_folders([self.cache_root, folder])
                await self._put_atomic(remote, archive.chunks())
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
        _, sftp = self._require()
        try:
            attrs = await sftp.lstat(remote)
        except asyncssh.SFTPNoSuchFile:
            return 0
        if attrs.type != asyncssh.FILEXFER_TYPE_DIRECTORY:
            return 0  # not a folder, or a link to one: not followed
        private_folders(logs_root, dest)
        files: list[tuple[str, Path]] = []
        await self._list_tree(sftp, remote, dest, files, top=True, skip=layout.not_fetched(include))
        sem = asyncio.Semaphore(_FETCH_PARALLEL)
        total = 0

        async def get(src: str, target: Path) -> None:
            nonlocal total
            done = 0

            def moved(_src: bytes, _dst: bytes, copied: int, _size: int) -> None:
                nonlocal done, total
                if progress is not None:
                    progress(copied - done)
                total += copied - done
                done = copied

            async with sem:
                # Made 0600 (never through a link) before the download fills it: SFTP's own
                # open would follow the console's umask.
                os.close(private_file(target))
                try:
                    await sftp.get(
                        src, str(target), preserve=False, follow_symlinks=False, progress_handler=moved
                    )
                except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPBadMessage):
                    target.unlink()  # gone meanwhile, or turned into a link pointing out of the tree
                    return
                made_private(target)

        await asyncio.gather(*(get(src, target) for src, target in files))
        return total

    async def _list_tree(
        self,
        sftp: asyncssh.SFTPClient,
        remote: str,
        dest: Path,
        files: list[tuple[str, Path]],
        top: bool,
        skip: frozenset[str] = frozenset(),
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
            if (top and name in skip) or not is_plain_name(name):
                continue  # the synced workdir is not a log; "..", "a/b" and odd names never are
            kind = entry.attrs.type
            if kind == asyncssh.FILEXFER_TYPE_DIRECTORY:
                sub = within(dest, name)
                private_subfolder(sub)
                await self._list_tree(sftp, remote_within(remote, name), sub, files, top=False)
            elif kind == asyncssh.FILEXFER_TYPE_REGULAR:
                files.append((remote_within(remote, name), within(dest, name)))

    async def holds_run(self, run_id: str) -> bool:
        _, sftp = self._require()
        try:
            await sftp.lstat(self.run_dir(run_id))
        except asyncssh.SFTPNoSuchFile:
            return False
        except asyncssh.SFTPError as exc:
            raise NodeUnreachable(f"{self._where}: cannot look for run {run_id}: {exc.reason}") from None
        return True

    async def close(self) -> None:
        if self.sftp is not None:
            self.sftp.exit()
        conns = ([self.conn] if self.conn is not None else []) + self._hops[::-1]  # the node, then its hops
        self.sftp, self.conn, self._hops = None, None, []
        for conn in conns:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), 5)
            except (TimeoutError, asyncssh.Error, OSError):
                pass
