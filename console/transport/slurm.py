"""Nodes of a Slurm allocation: agents started by one ``srun`` step, dialling back over TCP.

One :class:`SlurmLauncher` per session owns a listening socket and the step: ``srun --overlap
--nodes=N --ntasks-per-node=1 ...`` runs the fixed boot below on every node. Its command line
holds no inventory value and no secret: the console's address, the per-run key and the node
python reach the tasks through srun's environment (``--export=ALL``; the boot removes them from
its own environment before anything else starts, so ranks never see the key). Each task
connects back, both sides prove they hold the key (HMAC-SHA256 over two fresh nonces; the key
never crosses the wire), and the console sends ``agent/dial.py`` over that connection; the dial
then serves the control protocol described there. A :class:`SlurmTransport` per node waits for
its node's connection, deploys the agent bundle and the workdir through it, has the dial start
the normal agent on a second authenticated connection (that socket is the agent's stdin and
stdout), and fetches the logs back through it. No SSH key and no shared file system are needed.

The connections are authenticated, not encrypted: meant for the allocation's own network.
Closing the session closes every control connection: each dial ends its agent (which stops its
ranks) and exits, so the step ends; a step still there after that is signalled, and as a last
resort cancelled by name (``scancel JOB.STEP``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import ipaddress
import itertools
import json
import os
import posixpath
import secrets
import signal
import socket
import subprocess
import tarfile
import tempfile
import weakref
from collections.abc import AsyncIterator, Mapping
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from mscon.agent import layout
from mscon.console.config.inventory import Inventory, NodeSpec
from mscon.console.config.safepath import UnsafePath, is_plain_name, remote_within, within
from mscon.console.transport.base import LINE_LIMIT, AgentChannel, NodeTransport, NodeUnreachable
from mscon.console.transport.bundle import (
    AGENT_BOOT,
    AGENT_PACKAGE,
    AgentBundle,
    WorkdirArchive,
    agent_stdin_header,
)

PROTOCOL = "MSCON-DIAL 1"  # agent/dial.py: PROTOCOL
ENV_ADDR = "MSCON_DIAL_ADDR"
ENV_KEY = "MSCON_DIAL_KEY"
ENV_PYTHON = "MSCON_DIAL_PYTHON"
ENV_CONSOLE_ADDRESS = "MSCON_CONSOLE_ADDRESS"  # overrides the address the nodes dial
CONNECT_TIMEOUT_S = 120.0  # srun step start on every node, then each node's connection
AUTH_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 120.0
STEP_EXIT_WAIT_S = 15.0
_PUT_CHUNK = 4 << 20

# The task srun starts on each node. Fixed text: srun execs it without a shell, and /bin/sh only
# expands the python from the environment. The boot takes the three values out of its
# environment, connects, checks the console's proof before it sends its own, then runs the
# source the console sends (agent/dial.py) with the authenticated socket.
DIAL_SH = 'exec "$MSCON_DIAL_PYTHON" -c "$0"'
DIAL_BOOT = (
    "import os,sys,socket,hmac,hashlib\n"
    "e=os.environ;a=e.pop('MSCON_DIAL_ADDR','');k=bytes.fromhex(e.pop('MSCON_DIAL_KEY',''));"
    "e.pop('MSCON_DIAL_PYTHON',None)\n"
    "k or sys.exit('mscon dial: no key in the environment')\n"
    "M=lambda*p:hmac.new(k,'|'.join(p).encode(),hashlib.sha256).hexdigest()\n"
    "h,_,p=a.rpartition(':');s=socket.create_connection((h,int(p)),30);f=s.makefile('rb')\n"
    "n=os.urandom(16).hex();s.sendall(('MSCON-DIAL 1 boot %s\\n'%n).encode())\n"
    "w=f.readline(512).decode('ascii','replace').split()\n"
    "len(w)==2 and hmac.compare_digest(w[1],M('console',n,w[0])) or "
    "sys.exit('mscon dial: the console did not authenticate')\n"
    "s.sendall((M('node',w[0],n)+'\\n').encode());L=int(f.readline(32));g={'__name__':'mscon_dial'}\n"
    "exec(compile(f.read(L),'mscon_dial','exec'),g);g['serve'](s,f,k)\n"
)


class DialRole(StrEnum):
    """What a connection that authenticated is for (the third word of its first line)."""

    BOOT = "boot"  # a task srun started: gets the dial's source, then is the node's control link
    AGENT = "agent"  # the dial's second connection: the agent's stdin and stdout


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def _dial_source() -> bytes:
    """dial.py with layout.py's source ahead of it: the dial runs from source, with no package to
    import the layout from."""
    agent = resources.files("mscon.agent")
    return agent.joinpath("layout.py").read_bytes() + b"\n" + agent.joinpath("dial.py").read_bytes()


def _set_keepalive(writer: asyncio.StreamWriter, interval_s: float) -> None:
    """A vanished node ends its connections within about three intervals (SSH's keepalives do
    this for the SSH transport)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    ivl = max(1, int(interval_s))
    for level, name, value in (
        (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
        (socket.IPPROTO_TCP, "TCP_KEEPIDLE", ivl),
        (socket.IPPROTO_TCP, "TCP_KEEPINTVL", ivl),
        (socket.IPPROTO_TCP, "TCP_KEEPCNT", 2),
        (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", 3 * ivl * 1000),
    ):
        opt = getattr(socket, name, None)
        if opt is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, opt, value)


def console_address(hosts: tuple[str, ...], env: Mapping[str, str] = os.environ) -> str:
    """The address the nodes dial: ``MSCON_CONSOLE_ADDRESS``, else this machine's source address
    (the route the kernel would take) toward the first node whose name resolves to a non-loopback
    address, else loopback (every node is this machine)."""
    given = env.get(ENV_CONSOLE_ADDRESS, "").strip()
    if given:
        try:
            return str(ipaddress.ip_address(given))
        except ValueError:
            raise NodeUnreachable(f"{ENV_CONSOLE_ADDRESS}={given[:60]!r}: expected an IP address") from None
    for host in hosts[:16]:
        try:
            infos = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)
        except (OSError, UnicodeError):
            continue
        for *_, addr in infos:
            if ipaddress.ip_address(addr[0]).is_loopback:
                continue
            with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((addr[0], 9))  # UDP: no packet is sent, the kernel only picks a route
                return str(s.getsockname()[0])
    return "127.0.0.1"


class Control:
    """One node's dial connection: requests with ids, and the dial's notices."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello: dict) -> None:
        self.reader, self.writer = reader, writer
        self.node = str(hello.get("node", ""))
        self.home = str(hello.get("home", ""))
        self.hostname = str(hello.get("hostname", ""))
        peer = writer.get_extra_info("peername")
        self.peer_ip = str(peer[0]) if peer else ""
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Queue[dict]] = {}
        self.stderr = ""
        self.agent_done = asyncio.Event()
        self.agent_done.set()  # no agent yet
        self.closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read(), name=f"dial:{self.node}")

    async def _read(self) -> None:
        try:
            while line := await self.reader.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict):
                    continue
                op = msg.get("op")
                if op == "stderr":
                    self.stderr = (self.stderr + str(msg.get("data", "")))[-8192:]
                elif op == "exited":
                    self.agent_done.set()
                elif isinstance(msg.get("id"), int) and msg["id"] in self._pending:
                    self._pending[msg["id"]].put_nowait(msg)
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self.closed.set()
            self.agent_done.set()
            for q in self._pending.values():
                q.put_nowait({"error": "the node's connection closed"})

    async def _send(self, obj: dict[str, Any]) -> None:
        if self.closed.is_set():
            raise NodeUnreachable(f"{self.node}: the node's connection is closed")
        self.writer.write((json.dumps(obj, separators=(",", ":")) + "\n").encode())
        await self.writer.drain()

    async def stream(self, op: str, **args: Any) -> AsyncIterator[dict]:
        """The answers to one request: ``chunk`` answers (fetch), then the last one."""
        rid = next(self._ids)
        q: asyncio.Queue[dict] = asyncio.Queue()
        self._pending[rid] = q
        try:
            await self._send({"id": rid, "op": op, **args})
            while True:
                msg = await asyncio.wait_for(q.get(), REQUEST_TIMEOUT_S)
                if "error" in msg:
                    raise NodeUnreachable(f"{self.node}: {op}: {msg['error']}")
                yield msg
                if "chunk" not in msg:
                    return
        finally:
            self._pending.pop(rid, None)

    async def request(self, op: str, **args: Any) -> dict:
        last: dict = {}
        async for msg in self.stream(op, **args):
            last = msg
        return last

    def close(self) -> None:
        self.writer.close()


class SlurmLauncher:
    """The session's one srun step, its listening socket, and the nodes' connections."""

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv
        self.key = secrets.token_bytes(32)
        self.step_name = f"mscon-{secrets.token_hex(4)}"  # unique: a leftover is cancelled by name
        self.nodes: dict[str, NodeSpec] = {}  # by host name (what the dial reports)
        self.controls: dict[str, Control] = {}
        self.waiting: dict[str, asyncio.Future[Control]] = {}
        self.agents: dict[str, asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self.held: set[str] = set()
        self.python: str | None = None
        self.server: asyncio.Server | None = None
        self.address = ""
        self.steps: list[asyncio.subprocess.Process] = []
        self.step_errors: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lock = asyncio.Lock()
        self._started: set[str] = set()  # hosts a step was launched for
        self.closed = False

    def hold(self, node: NodeSpec) -> None:
        self.nodes[node.host] = node
        self.held.add(node.host)

    # ------------------------------------------------------------ listening

    async def _listen(self) -> None:
        if self.server is not None:
            return
        self.address = await asyncio.to_thread(console_address, tuple(self.nodes))
        self.server = await asyncio.start_server(self._accept, self.address, 0, limit=LINE_LIMIT)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            role = await asyncio.wait_for(self._authenticate(reader, writer), AUTH_TIMEOUT_S)
            if role is DialRole.BOOT:
                await asyncio.wait_for(self._boot(reader, writer), AUTH_TIMEOUT_S)
            else:
                token = (await asyncio.wait_for(reader.readline(), AUTH_TIMEOUT_S)).decode("ascii", "replace")
                fut = self.agents.pop(token.strip(), None)
                if fut is None or fut.done():
                    raise ValueError("unknown token")
                _set_keepalive(writer, self.inv.ssh.keepalive_s)
                fut.set_result((reader, writer))
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()  # not one of ours, or it broke off: nothing is sent to it

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> DialRole:
        words = (await reader.readline()).decode("ascii", "replace").split()
        if len(words) != 4 or " ".join(words[:2]) != PROTOCOL or words[2] not in set(DialRole):
            raise ValueError("not a dial")
        nonce_n, nonce_c = words[3][:64], secrets.token_hex(16)
        writer.write(f"{nonce_c} {_mac(self.key, 'console', nonce_n, nonce_c)}\n".encode())
        await writer.drain()
        proof = (await reader.readline()).decode("ascii", "replace").strip()
        if not hmac.compare_digest(proof, _mac(self.key, "node", nonce_c, nonce_n)):
            raise ValueError("bad proof")
        return DialRole(words[2])

    async def _boot(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        source = _dial_source()
        writer.write(f"{len(source)}\n".encode() + source)
        await writer.drain()
        hello = json.loads(await reader.readline())
        if not isinstance(hello, dict) or hello.get("op") != "hello":
            raise ValueError("no hello")
        host = str(hello.get("node", ""))
        fut = self.waiting.get(host)
        if fut is None or fut.done() or host in self.controls:
            raise ValueError(f"unexpected node {host!r}")
        home = str(hello.get("home", ""))
        if not home.startswith("/") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in home):
            raise ValueError(f"unusable home {home!r}")
        _set_keepalive(writer, self.inv.ssh.keepalive_s)
        ctl = Control(reader, writer, hello)
        ctl.home = posixpath.normpath(home)
        self.controls[host] = ctl
        fut.set_result(ctl)

    # ------------------------------------------------------------ the step

    async def control(self, node: NodeSpec, python: str) -> Control:
        """The node's live control connection; the first call launches the step for every held
        node without one, a later one (a lost node coming back) a step for that node alone."""
        async with self._lock:
            ctl = self.controls.get(node.host)
            if ctl is not None and not ctl.closed.is_set():
                return ctl
            self.controls.pop(node.host, None)
            if self.python is not None and python != self.python:
                raise NodeUnreachable(
                    f"{node.name}: nodes from Slurm share one python (defaults.python); got {python!r} "
                    f"and {self.python!r}"
                )
            self.python = python
            fut = self.waiting.get(node.host)
            if fut is None or fut.done():
                await self._listen()
                hosts = [h for h in self.nodes if h in self.held and not self._live(h)]
                if node.host in self._started:
                    hosts = [node.host]  # a lost node: its own step
                for h in hosts:
                    self.waiting[h] = asyncio.get_running_loop().create_future()
                await self._start_step(hosts)
            fut = self.waiting[node.host]
        try:
            return await asyncio.wait_for(asyncio.shield(fut), CONNECT_TIMEOUT_S)
        except TimeoutError:
            raise NodeUnreachable(
                f"{node.name}: no connection from its agent within {CONNECT_TIMEOUT_S:g} s of srun"
                + self._step_detail()
            ) from None

    def _live(self, host: str) -> bool:
        ctl = self.controls.get(host)
        return ctl is not None and not ctl.closed.is_set()

    def _step_detail(self) -> str:
        return f" (srun: {self.step_errors[-1]})" if self.step_errors else ""

    async def _start_step(self, hosts: list[str]) -> None:
        argv = [
            "srun",
            "--overlap",  # share the allocation with the job's own steps (sbatch's batch step)
            f"--nodes={len(hosts)}",
            f"--ntasks={len(hosts)}",
            "--ntasks-per-node=1",
            "--cpu-bind=none",  # the ranks the agent starts get every CPU, not the task's one
            "--kill-on-bad-exit=0",  # one node's agent ending is the console's call, not srun's
            "--export=ALL",
            "--input=none",
            f"--job-name={self.step_name}",
        ]
        if set(hosts) != set(self.nodes):
            # A subset (a lost node): its host name, as Slurm itself listed it (checked, no value
            # of the inventory).
            argv.append("--nodelist=" + ",".join(hosts))
        argv += ["/bin/sh", "-c", DIAL_SH, DIAL_BOOT]
        assert self.python is not None and self.server is not None
        env = {
            **os.environ,
            ENV_ADDR: f"{self.address}:{self.port}",
            ENV_KEY: self.key.hex(),
            ENV_PYTHON: self.python,
        }
        self._started.update(hosts)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C is the console's to handle
            )
        except OSError as exc:
            error = f"cannot run srun: {exc.strerror or exc}"
            for h in hosts:
                self.waiting[h].set_exception(NodeUnreachable(f"{self.nodes[h].name}: {error}"))
            return
        self.steps.append(proc)
        task = asyncio.get_running_loop().create_task(self._watch_step(proc, hosts), name="srun")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_step(self, proc: asyncio.subprocess.Process, hosts: list[str]) -> None:
        assert proc.stderr is not None
        tail: list[str] = []
        while line := await proc.stderr.readline():
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                tail = [*tail[-19:], text]
                self.step_errors.append(text)
                del self.step_errors[:-20]
        code = await proc.wait()
        why = f"srun exited with {code}" + (f": {tail[-1]}" if tail else "")
        for h in hosts:
            fut = self.waiting.get(h)
            if fut is not None and not fut.done():
                fut.set_exception(NodeUnreachable(f"{self.nodes[h].name}: no agent connected; {why}"))

    # ------------------------------------------------------------ agents

    def expect_agent(self, token: str) -> asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        fut: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        fut = asyncio.get_running_loop().create_future()
        self.agents[token] = fut
        return fut

    # ------------------------------------------------------------ closing

    async def release(self, host: str) -> None:
        self.held.discard(host)
        if not self.held and not self.closed:
            await self.close()

    async def close(self) -> None:
        """Close every connection; the dials end their agents and exit, so the step ends. A
        step still there is signalled, then cancelled by name."""
        self.closed = True
        for ctl in self.controls.values():
            ctl.close()
        for fut in self.waiting.values():
            if not fut.done():
                fut.cancel()
        if self.server is not None:
            self.server.close()
        wait_s = STEP_EXIT_WAIT_S + self.inv.stop.grace_s
        for proc in self.steps:
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None and proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(sig)
                try:
                    await asyncio.wait_for(proc.wait(), wait_s if sig is None else 5.0)
                    break
                except TimeoutError:
                    continue
        await asyncio.to_thread(self._cancel_leftovers)
        for task in list(self._tasks):
            task.cancel()

    def _cancel_leftovers(self) -> None:
        """Steps of ours Slurm still lists (srun was killed before they ended): cancel them."""
        job = os.environ.get("SLURM_JOB_ID", "")
        if not self.steps or not job.isdigit():
            return
        try:
            listed = subprocess.run(
                ["squeue", "-h", "-s", "-j", job, "-o", "%i %j"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return
        for line in listed.splitlines():
            step, _, name = line.strip().partition(" ")
            if name == self.step_name and step.startswith(f"{job}."):
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        ["scancel", step], stdin=subprocess.DEVNULL, capture_output=True, timeout=30
                    )


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

    async def close(self, wait_s: float = 10.0) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            if self.writer.can_write_eof():
                self.writer.write_eof()  # the agent reads EOF: it stops its ranks and exits
        try:
            await asyncio.wait_for(self.ctl.agent_done.wait(), wait_s)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ctl.request("kill"), 5)
        self.writer.close()

    async def release(self) -> None:
        # Never kill on release. A detached agent cannot outlive this transport anyway: the srun
        # step ends with the console's connections, and Slurm ends every process of the step.
        self.writer.close()

    def _stderr_raw(self) -> str:
        return self.ctl.stderr


class SlurmTransport(NodeTransport):
    def __init__(self, node: NodeSpec, launcher: SlurmLauncher) -> None:
        super().__init__(node)
        self.launcher = launcher
        self.ctl: Control | None = None
        launcher.hold(node)

    def _require(self) -> Control:
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
        ctl = self._require()
        for start in range(0, max(len(data), 1), _PUT_CHUNK):
            chunk = data[start : start + _PUT_CHUNK]
            last = start + _PUT_CHUNK >= len(data)
            await ctl.request("put", path=rel, data=base64.b64encode(chunk).decode("ascii"), last=last)

    async def _exists(self, rel: str) -> bool:
        return bool((await self._require().request("exists", path=rel)).get("exists"))

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
            await self._put(rel, archive.data)
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
        fut = self.launcher.expect_agent(token)
        ctl.agent_done = asyncio.Event()
        ctl.stderr = ""
        try:
            await ctl.request("agent", token=token, code=AGENT_BOOT)
            reader, writer = await asyncio.wait_for(fut, AUTH_TIMEOUT_S * 2)
        except TimeoutError:
            raise NodeUnreachable(f"{self.node.name}: the agent did not connect back") from None
        finally:
            self.launcher.agents.pop(token, None)
        channel = SlurmChannel(reader, writer, ctl)
        with contextlib.suppress(OSError, RuntimeError):
            await channel._write(header)
        return channel

    async def fetch_run_dir(self, remote: str, local: str, logs_root: str | None = None) -> None:
        dest = self._fetch_dest(local, logs_root)  # refused before anything is written
        self._check_run_dir(remote)
        ctl = self._require()
        with tempfile.TemporaryFile() as buf:
            async for msg in ctl.stream("fetch", path=self._rel(remote)):
                if "chunk" in msg:
                    buf.write(base64.b64decode(msg["chunk"]))
            if buf.tell() == 0:
                return  # no run folder on the node
            buf.seek(0)
            dest.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(_extract, buf, dest)

    async def close(self) -> None:
        await self.launcher.release(self.node.host)


def _extract(fileobj: Any, dest: Path) -> None:
    """Plain names, folders and regular files only; nothing written through a link."""
    with tarfile.open(fileobj=fileobj, mode="r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not all(is_plain_name(p) for p in parts) or parts[0] == layout.WORK_DIR:
                continue
            target = within(dest, *parts)
            if member.isdir():
                if target.is_symlink():
                    target.unlink()
                target.mkdir(parents=True, exist_ok=True)
            elif member.isreg():
                src = tar.extractfile(member)
                if src is None:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink():
                    target.unlink()
                fd = os.open(
                    target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644
                )
                with os.fdopen(fd, "wb") as out:
                    while data := src.read(1 << 20):
                        out.write(data)


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
