"""The console's end of the Slurm dial (``agent/dial.py`` is the node's end).

The fixed boot srun runs on every node (:data:`DIAL_BOOT`), the line of values it reads from its
stdin (:func:`boot_line`), the mutual handshakes (TLS with the run's certificate, pinned both ways:
``agent/tls.py``; inside it HMAC-SHA256 over two fresh nonces, the key never crossing the wire),
the dial's source sent on a boot connection, and :class:`Control`: the requests of the control
protocol (JSON lines with ids: ``exists``, ``put`` in parts, ``agent``, ``fetch`` in chunks,
``kill``) and the dial's notices (``stderr``, ``exited``). Every connection is TLS from its first
byte on: private and authenticated both ways, whatever network the allocation has.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import posixpath
import secrets
import socket
from collections.abc import AsyncIterator, Iterable
from enum import StrEnum
from importlib import resources
from typing import IO, Any

from mscon.console.transport.base import NodeUnreachable, Progress
from mscon.console.transport.slurm_keys import DialKey, Keyring, KeyUse

PROTOCOL = "MSCON-DIAL 1"  # agent/dial.py: PROTOCOL
ENV_PYTHON = "MSCON_DIAL_PYTHON"  # the node's python: the one value srun's environment carries (no secret)
BOOT_LINE_MAX = 1 << 16  # the boot reads at most this many bytes of its stdin line
AUTH_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 120.0
PUT_CHUNK = 4 << 20

# The task srun starts on each node. Fixed text: srun execs it without a shell, and /bin/sh only
# expands the python from the environment. ``-I``: neither the folder it starts in nor PYTHON*
# variables reach sys.path, so a planted hmac.py (in a shared job folder, or /tmp where Slurm
# falls back) never runs. The boot reads its values (the console's address, the step's key, the
# run's TLS certificate and key: :func:`boot_line`) from its stdin, one line that the console
# wrote on srun's stdin and srun hands every task (``--input=all``), and then puts /dev/null in
# its place: no process holds them in its environment, srun's on the console's machine included,
# and nothing the dial starts inherits the pipe. It then runs tls.py's source (carried in the
# boot itself: nothing else may cross before TLS), connects with the run's certificate and checks
# the console's (again, for up to 60 s, while the console's port closes it before its proof: a
# flood of connections from the node's address pushes out the oldest), names its step's key by
# its id, checks the console's proof before it sends its own, then runs the source the console
# sends (agent/dial.py) with the authenticated connection; the console then hands the dial a key
# of the node's own (slurm_keys.py).
DIAL_SH = 'exec "$MSCON_DIAL_PYTHON" -I -c "$0"'
_BOOT = (
    "import os,sys,hmac,hashlib\n"
    "os.environ.pop('MSCON_DIAL_PYTHON',None);N=" + str(BOOT_LINE_MAX) + "\n"
    "def X(b=b''):\n"
    " try:\n"
    "  while len(b)<N and b[-1:]!=b'\\n':\n"
    "   r=os.read(0,N-len(b))\n"
    "   if not r:break\n"
    "   b+=r\n"
    "  w=b.split()\n"
    "  b[-1:]==b'\\n' and len(w)==4 or sys.exit('mscon dial: no key line on stdin (srun --input=all)')\n"
    "  return w[0].decode(),bytes.fromhex(w[1].decode()),"
    "bytes.fromhex(w[2].decode()).decode(),bytes.fromhex(w[3].decode()).decode()\n"
    " except (OSError,ValueError) as x:sys.exit('mscon dial: no usable key line on stdin: %s'%x)\n"
    "a,k,C,Q=X();n=os.open(os.devnull,os.O_RDONLY);os.dup2(n,0);n and os.close(n)\n"
    "I=hashlib.sha256(b'mscon dial key id|'+k).hexdigest()[:32]\n"
    "g={'__name__':'mscon_dial'};exec(compile(T,'mscon_tls','exec'),g)\n"
    "M=lambda*p:hmac.new(k,'|'.join(p).encode(),hashlib.sha256).hexdigest()\n"
    "def B(s):\n"
    " s.settimeout(30);f=s.makefile('rb');n=os.urandom(16).hex()\n"
    " s.sendall(('MSCON-DIAL 1 boot %s %s\\n'%(n,I)).encode())\n"
    " w=f.readline(512).decode('ascii','replace').split()\n"
    " if not w:raise EOFError('closed before the proof')\n"
    " return f,n,w\n"
    "h,_,p=a.rpartition(':');s,(f,n,w)=g['dial'](h,int(p),C,Q,60,B)\n"
    "len(w)==2 and hmac.compare_digest(w[1],M('console',n,w[0])) or "
    "sys.exit('mscon dial: the console did not authenticate')\n"
    "s.sendall((M('node',w[0],n)+'\\n').encode());L=int(f.readline(32))\n"
    "exec(compile(f.read(L),'mscon_dial','exec'),g);g['serve'](s,f,C,Q)\n"
)


def _boot() -> str:
    return "T=" + repr(resources.files("mscon.agent").joinpath("tls.py").read_text()) + "\n" + _BOOT


DIAL_BOOT = _boot()


def boot_line(address: str, key: bytes, cert: str, tls_key: str) -> bytes:
    """What the console writes on srun's stdin for every task of a step: the address to dial, the
    step's key, the run's certificate and its private key (PEM as hex: one line of four words)."""
    line = f"{address} {key.hex()} {cert.encode().hex()} {tls_key.encode().hex()}\n".encode()
    if len(line) > BOOT_LINE_MAX or len(line.split()) != 4:
        raise ValueError("the boot's line: four words of at most BOOT_LINE_MAX bytes in all")
    return line


class DialRole(StrEnum):
    """What a connection that authenticated is for (the third word of its first line)."""

    BOOT = "boot"  # a task srun started: gets the dial's source, then is the node's control link
    AGENT = "agent"  # the dial's second connection: the agent's stdin and stdout


def mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def dial_source() -> bytes:
    """dial.py with layout.py's and exit_codes.py's sources ahead of it: the dial runs from source,
    with no package to import them from (layout.py first: its ``from __future__`` must open the source)."""
    agent = resources.files("mscon.agent")
    return b"\n".join(agent.joinpath(name).read_bytes() for name in ("layout.py", "exit_codes.py", "dial.py"))


def set_keepalive(writer: asyncio.StreamWriter, interval_s: float) -> None:
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


async def authenticate(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keys: Keyring
) -> tuple[DialRole, DialKey]:
    """The console's side of the challenge-response: its proof first, then the node's is checked,
    with the key the node names by its id: a step's key for a boot, a node's key for an agent.
    Raises ValueError for anything that is not a dial holding a key of ``keys`` for its role."""
    words = (await reader.readline()).decode("ascii", "replace").split()
    if len(words) != 5 or " ".join(words[:2]) != PROTOCOL or words[2] not in set(DialRole):
        raise ValueError("not a dial")
    role = DialRole(words[2])
    found = keys.get(words[4])
    if found is None or found.use is not (KeyUse.STEP if role is DialRole.BOOT else KeyUse.NODE):
        raise ValueError("unknown key")
    key = found.key
    nonce_n, nonce_c = words[3][:64], secrets.token_hex(16)
    writer.write(f"{nonce_c} {mac(key, 'console', nonce_n, nonce_c)}\n".encode())
    await writer.drain()
    proof = (await reader.readline()).decode("ascii", "replace").strip()
    if not hmac.compare_digest(proof, mac(key, "node", nonce_c, nonce_n)):
        raise ValueError("bad proof")
    return role, found


async def send_dial(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict:
    """Send the dial's source on an authenticated boot connection; the dial's hello."""
    source = dial_source()
    writer.write(f"{len(source)}\n".encode() + source)
    await writer.drain()
    hello = json.loads(await reader.readline())
    if not isinstance(hello, dict) or hello.get("op") != "hello":
        raise ValueError("no hello")
    return hello


def hello_home(hello: dict) -> str:
    """The node user's home from the dial's hello: an absolute path with no control character."""
    home = str(hello.get("home", ""))
    if not home.startswith("/") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in home):
        raise ValueError(f"unusable home {home!r}")
    return posixpath.normpath(home)


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
        self.refused = ""  # why the console closed this node's connections (a second boot for it)
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

    async def exists(self, rel: str) -> bool:
        return bool((await self.request("exists", path=rel)).get("exists"))

    async def put(self, rel: str, data: bytes | Iterable[bytes]) -> None:
        """A file under the node's mscon folder (or its pieces, in order), sent in parts of at most
        PUT_CHUNK bytes (the dial writes it atomically)."""
        pieces = iter([data] if isinstance(data, bytes) else data)
        held = b""
        for piece in pieces:
            held += piece
            while len(held) > PUT_CHUNK:
                await self._put_part(rel, held[:PUT_CHUNK], last=False)
                held = held[PUT_CHUNK:]
        await self._put_part(rel, held, last=True)

    async def _put_part(self, rel: str, chunk: bytes, last: bool) -> None:
        await self.request("put", path=rel, data=base64.b64encode(chunk).decode("ascii"), last=last)

    async def give_key(self, key: bytes) -> None:
        """The node's own key: the dial proves it on its agent connections (once per dial)."""
        await self.request("key", key=key.hex())

    def refuse(self, line: str) -> None:
        """Close this node's connection, ``line`` saying why (what the node's error will say)."""
        self.refused = line
        self.writer.transport.abort()  # at once: no TLS goodbye to a peer that may not be ours

    async def start_agent(self, token: str, code: str) -> None:
        """Have the dial start the agent on a second connection that presents ``token``."""
        self.agent_done = asyncio.Event()
        self.stderr = ""
        await self.request("agent", token=token, code=code)

    async def kill_agent(self) -> None:
        await self.request("kill")

    async def fetch(
        self, rel: str, out: IO[bytes], include: tuple[str, ...] = (), progress: Progress | None = None
    ) -> None:
        """A run folder as tar.gz (less ``layout.not_fetched(include)``), written to ``out`` as its
        chunks come (nothing for no folder); ``progress`` is told each chunk's size."""
        async for msg in self.stream("fetch", path=rel, include=list(include)):
            if "chunk" in msg:
                data = base64.b64decode(msg["chunk"])
                out.write(data)
                if progress is not None:
                    progress(len(data))

    def close(self) -> None:
        self.writer.close()
