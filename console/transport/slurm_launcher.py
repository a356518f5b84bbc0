"""The session's one ``srun`` step, its listening socket, and the nodes' dial connections.

``srun --overlap --nodes=N --ntasks-per-node=1 ...`` runs the fixed boot (``slurm_dial.DIAL_BOOT``)
on every node, in ``/`` (``--chdir``) and isolated from it (``python -I``). Its command line holds
no inventory value and no secret: the console's address, the step's key (``slurm_keys.py``: fresh
for every step, one boot per node, then a key of the node's own handed over the connection) and the
run's TLS certificate and key (``link_tls.py``) are one line the console writes on srun's stdin and
closes; srun hands it to every task (``--input=all``: it reads its stdin only once every node's
step has connected, so a node that starts late gets it too). No process's environment holds them,
srun's here included. The node python, no secret, is the one value srun's environment carries
(``--export=ALL``).

The listening port keeps the limits of every mscon listener (``agent/gate.py``): a connection has
``HANDSHAKE_S`` for its TLS handshake and the key's proof together, at most ``PENDING_MAX`` are in
progress (over it, one that held no whole ClientHello when accepted goes first, from the busiest
address; one past TLS never goes), no byte of a line is read before
TLS has checked the peer's certificate, and asyncio's accept loop pauses, not stops, when
descriptors run out. Closing ends every control connection: each dial ends its agent and exits, so the step
ends; a step still there after that is signalled, and as a last resort cancelled by name
(``scancel JOB.STEP``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import ssl
import subprocess
from collections.abc import Mapping
from typing import Any

from mscon.agent import gate, tls
from mscon.console.config.inventory import Inventory, NodeSpec
from mscon.console.transport.base import NodeUnreachable, authenticated, pre_auth_reader
from mscon.console.transport.link_tls import make_run_tls
from mscon.console.transport.slurm_dial import (
    AUTH_TIMEOUT_S,
    DIAL_BOOT,
    DIAL_SH,
    ENV_PYTHON,
    Control,
    DialRole,
    authenticate,
    boot_line,
    hello_home,
    send_dial,
    set_keepalive,
)
from mscon.console.transport.slurm_keys import BootRefused, DialKey, Keyring

_Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
ENV_CONSOLE_ADDRESS = "MSCON_CONSOLE_ADDRESS"  # overrides the address the nodes dial
CONNECT_TIMEOUT_S = 120.0  # srun step start on every node, then each node's connection
STEP_EXIT_WAIT_S = 15.0
# The step's working folder: one that exists on every node before the dial can tell the node's
# home (its run folders are under it), and that no other user can write. The dial starts the
# agent in the home itself.
STEP_CWD = "/"


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


class SlurmLauncher:
    """The session's one srun step, its listening socket, and the nodes' connections."""

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv
        self.keys = Keyring()  # the steps' keys and the nodes'
        self.tls = make_run_tls("mscon slurm run")
        self._tls_ctx: ssl.SSLContext = tls.server_context(self.tls.cert, self.tls.key)
        self._pending = gate.Pending()  # connections not authenticated yet (their writers)
        self.step_name = f"mscon-{secrets.token_hex(4)}"  # unique: a leftover is cancelled by name
        self.nodes: dict[str, NodeSpec] = {}  # by host name (what the dial reports)
        self.controls: dict[str, Control] = {}
        self.waiting: dict[str, asyncio.Future[Control]] = {}
        # By one-time token: the node it was issued to, and the agent's connection once it came.
        self.agents: dict[str, tuple[str, asyncio.Future[_Streams]]] = {}
        self.agent_writers: dict[str, asyncio.StreamWriter] = {}  # by host: its agent's connection
        self.refusals: list[str] = []  # second boots refused, one line each
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
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Incoming(self), self.address, 0)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def _incoming(self, raw: asyncio.BaseTransport) -> None:
        """A new TCP connection (nothing read from it yet): counted as pending, its handshake
        started at once."""
        peer = raw.get_extra_info("peername")
        sock = raw.get_extra_info("socket")
        # A whole ClientHello already waiting marks a real dial (a flood's silent or garbled
        # connections are shed first); start_tls gives no hook for the hello arriving later.
        began = sock is not None and gate.hello_waiting(sock)
        victims = self._pending.add(raw, str(peer[0]) if peer else "", gate.PENDING_MAX, valid=began)
        for victim in victims:
            victim.abort()  # over the cap: the gate's choice (gate.Pending says the order)
        if raw in victims:
            return  # every handshake in progress holds the run's certificate
        task = asyncio.get_running_loop().create_task(self._accept(raw), name="dial-accept")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        reader = pre_auth_reader()  # short lines until the peer proves its key
        protocol = asyncio.StreamReaderProtocol(reader)
        writer: asyncio.StreamWriter | None = None
        try:
            # TLS first, then the key's proof inside it, within one deadline however the peer
            # paces its bytes. (loop.start_tls, not StreamWriter.start_tls: that one breaks on a
            # connection closed during the handshake.)
            async with asyncio.timeout(gate.HANDSHAKE_S):
                secure = await loop.start_tls(
                    raw, protocol, self._tls_ctx, server_side=True, ssl_handshake_timeout=gate.HANDSHAKE_S
                )
                if secure is None:
                    raise ConnectionResetError("closed during the TLS handshake")
                protocol.connection_made(secure)
                writer = asyncio.StreamWriter(secure, protocol, reader, loop)
                tls.check_peer(secure.get_extra_info("ssl_object"), self.tls.cert)
                if not self._pending.trust(raw):  # from here on no flood pushes it out
                    raise ValueError("pushed out")
                role, key = await authenticate(reader, writer, self.keys)
                authenticated(reader)
            if not self._pending.discard(raw):
                raise ValueError("pushed out")
            if role is DialRole.BOOT:
                await asyncio.wait_for(self._boot(reader, writer, key), AUTH_TIMEOUT_S)
            else:
                token = (await asyncio.wait_for(reader.readline(), AUTH_TIMEOUT_S)).decode("ascii", "replace")
                host, fut = self.agents.pop(token.strip(), ("", None))
                if fut is None or fut.done() or key.hosts != {host}:
                    raise ValueError("unknown token")  # or one issued to another node
                set_keepalive(writer, self.inv.ssh.keepalive_s)
                self.agent_writers[host] = writer
                fut.set_result((reader, writer))
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self._pending.discard(raw)
            # Not one of ours, or it broke off: nothing is sent to it.
            (writer.transport if writer is not None else raw).abort()

    async def _boot(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, step: DialKey) -> None:
        hello = await send_dial(reader, writer)
        host = str(hello.get("node", ""))
        peer = writer.get_extra_info("peername")
        try:
            node_key = self.keys.claim(step, host, str(peer[0]) if peer else "?")
        except BootRefused as exc:
            if host in step.hosts:
                self._refuse(host, str(exc))
            raise ValueError(str(exc)) from None
        fut = self.waiting.get(host)
        if fut is None or fut.done() or host in self.controls:
            raise ValueError(f"unexpected node {host!r}")
        home = hello_home(hello)
        set_keepalive(writer, self.inv.ssh.keepalive_s)
        ctl = Control(reader, writer, hello)
        ctl.home = home
        await ctl.give_key(node_key)
        self.controls[host] = ctl
        fut.set_result(ctl)

    def _refuse(self, host: str, line: str) -> None:
        """A second boot for ``host`` in one step: two parties hold the step's key and neither can
        be told from the other, so the node's connections are closed too, ``line`` saying why
        (the node's error: one line in the console's log and summary)."""
        self.refusals.append(line)
        ctl = self.controls.get(host)
        if ctl is not None:
            ctl.refuse(line)
        agent = self.agent_writers.pop(host, None)
        if agent is not None:
            agent.transport.abort()
        fut = self.waiting.get(host)
        if fut is not None and not fut.done():
            fut.set_exception(NodeUnreachable(line))

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
            "--input=all",  # the boot's line (boot_line) to every task; then end of file
            f"--chdir={STEP_CWD}",  # not the console's folder, nor /tmp where Slurm falls back
            f"--job-name={self.step_name}",
        ]
        if set(hosts) != set(self.nodes):
            # A subset (a lost node): its host name, as Slurm itself listed it (checked, no value
            # of the inventory).
            argv.append("--nodelist=" + ",".join(hosts))
        argv += ["/bin/sh", "-c", DIAL_SH, DIAL_BOOT]
        assert self.python is not None and self.server is not None
        step, key = self.keys.new_step(frozenset(hosts))
        line = boot_line(f"{self.address}:{self.port}", key, self.tls.cert, self.tls.key)
        env = {**os.environ, ENV_PYTHON: self.python}
        self._started.update(hosts)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C is the console's to handle
            )
        except OSError as exc:
            self.keys.end_step(step)
            error = f"cannot run srun: {exc.strerror or exc}"
            for h in hosts:
                self.waiting[h].set_exception(NodeUnreachable(f"{self.nodes[h].name}: {error}"))
            return
        assert proc.stdin is not None
        # Into the pipe's buffer at once (a few KiB), then its end: srun reads it when every node's
        # step has connected, and no task gets more (an srun that already died: its error says why).
        proc.stdin.write(line)
        proc.stdin.close()
        self.steps.append(proc)
        # This step's waits only: a lost node's new step may wait for the same host while this one ends.
        waits = {h: self.waiting[h] for h in hosts}
        task = asyncio.get_running_loop().create_task(self._watch_step(proc, waits, step), name="srun")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_step(
        self, proc: asyncio.subprocess.Process, waits: dict[str, asyncio.Future[Control]], step: int
    ) -> None:
        assert proc.stderr is not None
        tail: list[str] = []
        while line := await proc.stderr.readline():
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                tail = [*tail[-19:], text]
                self.step_errors.append(text)
                del self.step_errors[:-20]
        code = await proc.wait()
        self.keys.end_step(step)  # its key proves nothing any more
        why = f"srun exited with {code}" + (f": {tail[-1]}" if tail else "")
        for h, fut in waits.items():
            if not fut.done():
                fut.set_exception(NodeUnreachable(f"{self.nodes[h].name}: no agent connected; {why}"))

    # ------------------------------------------------------------ agents

    def expect_agent(
        self, token: str, host: str
    ) -> asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        """The agent connection that presents ``token`` with ``host``'s own key."""
        fut: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        fut = asyncio.get_running_loop().create_future()
        self.agents[token] = (host, fut)
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
        self.keys.clear()
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


class _Incoming(asyncio.Protocol):
    """A TCP connection to the console's port until its TLS handshake starts (at once)."""

    def __init__(self, launcher: SlurmLauncher) -> None:
        self.launcher = launcher

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the peer's first bytes are TLS's: the handshake reads them
        self.launcher._incoming(transport)
