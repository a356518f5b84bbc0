"""The Slurm dial's keys and its boot, without Slurm (issue 45, items 1 and 2): a key per step that
boots each node once, a key per node after that, a second boot for a node refused and said; the
boot isolated from the folder it starts in and taking its key from its stdin, never an environment."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO
from mscon.agent import dial, tls
from mscon.console.config.inventory import load_inventory
from mscon.console.transport import link_tls
from mscon.console.transport import slurm as st
from mscon.console.transport import slurm_dial as sd
from mscon.console.transport import slurm_launcher as sl
from mscon.console.transport.base import NodeUnreachable
from mscon.console.transport.slurm_keys import BootRefused, Keyring, KeyUse, key_id

PLANTED = ("hmac", "json", "ssl")


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> sl.SlurmLauncher:
    monkeypatch.setenv(sl.ENV_CONSOLE_ADDRESS, "127.0.0.1")
    return sl.SlurmLauncher(load_inventory(REPO / "inventory" / "local.yaml"))


class FakeNode:
    """A node's boot connection as the dial speaks it: the step key's proof, the source read,
    a hello for ``host``, then the node key the console hands over (None: closed instead)."""

    def __init__(self, port: int, run: link_tls.RunTls, step_key: bytes, host: str) -> None:
        self.sock = tls.TlsSock(tls.connect("127.0.0.1", port, run.cert, run.key, 5))
        lines = dial.Lines(self.sock)
        dial.dial_handshake(self.sock, lines, step_key, "boot")
        size = int(lines.readline())
        source = b""
        while len(source) < size:
            source += lines.readline(size - len(source))
        assert source == sd.dial_source()
        hello = {"op": "hello", "node": host, "hostname": host, "home": "/nonexistent/home", "pid": 1}
        self.sock.sendall((json.dumps(hello) + "\n").encode())
        line = lines.readline()
        self.node_key: bytes | None = None
        if line:
            req = json.loads(line)
            assert req["op"] == "key"
            self.node_key = bytes.fromhex(req["key"])
            self.sock.sendall((json.dumps({"id": req["id"], "ok": True}) + "\n").encode())
        self.lines = lines

    def ended(self) -> bool:
        """The console closed this connection (reads until the end)."""
        try:
            while self.lines.readline():
                pass
        except OSError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


def _agent_conn(port: int, run: link_tls.RunTls, key: bytes, token: str) -> socket.socket:
    s = tls.TlsSock(tls.connect("127.0.0.1", port, run.cert, run.key, 5))
    dial.dial_handshake(s, dial.Lines(s), key, "agent")
    s.sendall(f"{token}\n".encode())
    return s


async def test_a_second_boot_for_a_node_is_refused_and_said(launcher: sl.SlurmLauncher) -> None:
    await launcher._listen()
    run, loop = launcher.tls, asyncio.get_running_loop()
    _, step_key = launcher.keys.new_step(frozenset({"n1", "n2"}))
    launcher.waiting["n1"] = loop.create_future()
    first = await asyncio.to_thread(FakeNode, launcher.port, run, step_key, "n1")
    second = None
    try:
        ctl = await asyncio.wait_for(launcher.waiting["n1"], 10)
        assert ctl.node == "n1" and first.node_key is not None and first.node_key != step_key
        # The node's own key proves its agent connections; the step's does not, nor does the
        # node key with a token issued to another node.
        wrong = launcher.expect_agent("t-n2", "n2")
        s = await asyncio.to_thread(_agent_conn, launcher.port, run, first.node_key, "t-n2")
        assert await asyncio.to_thread(FakeNode.ended, _Wrapped(s)) and not wrong.done()
        right = launcher.expect_agent("t-n1", "n1")
        s = await asyncio.to_thread(_agent_conn, launcher.port, run, first.node_key, "t-n1")
        await asyncio.wait_for(right, 10)
        # Someone else with the step's key says "boot" for n1: refused, and said once, as the
        # node's error; n1's connections are closed (neither party can be told from the other).
        second = await asyncio.to_thread(FakeNode, launcher.port, run, step_key, "n1")
        assert second.node_key is None
        line = "n1: refused a second boot for this node from 127.0.0.1 in step 1"
        assert len(launcher.refusals) == 1 and launcher.refusals[0].startswith(line), launcher.refusals
        await asyncio.wait_for(ctl.closed.wait(), 10)
        assert await asyncio.to_thread(first.ended)
        transport = st.SlurmTransport(launcher.nodes.get("n1") or _spec(), launcher)
        transport.ctl = ctl
        with pytest.raises(NodeUnreachable, match="refused a second boot"):
            transport._require()
        assert (
            st.SlurmChannel(*right.result(), ctl)
            .stderr_tail()
            .strip()
            .endswith("the node's connections are closed")
        )
        s.close()
    finally:
        first.close()
        if second is not None:
            second.close()
        await launcher.close()


class _Wrapped:
    """A plain socket as FakeNode.ended reads it."""

    def __init__(self, sock: socket.socket) -> None:
        self.lines = dial.Lines(sock)


def _spec():  # noqa: ANN202
    inv = load_inventory(REPO / "inventory" / "local.yaml")
    return inv.nodes[0]


def test_every_step_has_its_own_key_and_each_node_one_of_its_own() -> None:
    ring = Keyring()
    s1, k1 = ring.new_step(frozenset({"a", "b"}))
    s2, k2 = ring.new_step(frozenset({"a"}))  # a relaunch step for a lost node
    assert s1 != s2 and k1 != k2 and len(k1) == len(k2) == 32
    step1, step2 = ring.get(key_id(k1)), ring.get(key_id(k2))
    assert step1 is not None and step2 is not None and step1.use is step2.use is KeyUse.STEP
    na = ring.claim(step1, "a", "10.0.0.1")
    nb = ring.claim(step1, "b", "10.0.0.2")
    assert len({na, nb, k1, k2}) == 4
    with pytest.raises(BootRefused, match="a: refused a second boot for this node from 10.0.0.9 in step 1"):
        ring.claim(step1, "a", "10.0.0.9")
    with pytest.raises(BootRefused, match="not a node of step 2"):
        ring.claim(step2, "b", "10.0.0.2")
    na2 = ring.claim(step2, "a", "10.0.0.1")  # the relaunch: a's old key is dropped
    assert na2 != na and ring.get(key_id(na)) is None and ring.get(key_id(na2)) is not None
    ring.end_step(s1)  # its srun ended: its key proves nothing more
    assert ring.get(key_id(k1)) is None and ring.get(key_id(nb)) is not None


def _fake_console(
    run: link_tls.RunTls, key: bytes, probe: str, got: list[bytes]
) -> tuple[int, threading.Thread]:
    """A console that proves ``key``, checks the node's proof and sends ``probe`` as the dial's
    source; ``got``: the boot's first line, then what the probe sends back."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with srv:
            raw, _ = srv.accept()
            conn = tls.server_context(run.cert, run.key).wrap_socket(raw, server_side=True)
            with conn, conn.makefile("rb") as f:
                first = f.readline()
                got.append(first)
                nonce_n = first.split()[3].decode()
                nonce_c = os.urandom(16).hex()
                conn.sendall(f"{nonce_c} {sd.mac(key, 'console', nonce_n, nonce_c)}\n".encode())
                proof = f.readline().strip().decode()
                assert hmac.compare_digest(proof, sd.mac(key, "node", nonce_c, nonce_n))
                conn.sendall(f"{len(probe)}\n".encode() + probe.encode())
                got.append(f.read())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], t


# What the boot runs as the dial: reports its own /proc/self/environ, flags, cwd, sys.path and stdin.
_PROBE = """
def serve(s, f, C, Q):
    import os, sys
    with open('/proc/self/environ', 'rb') as e:
        env = e.read()
    s.sendall(repr({'environ': env, 'isolated': sys.flags.isolated, 'cwd': os.getcwd(), 'path': sys.path,
                    'tls': bool(C and Q), 'stdin': os.readlink('/proc/self/fd/0')}).encode())
    s.close()
    os._exit(0)
"""


def test_the_boot_runs_isolated_and_takes_its_key_from_stdin_not_its_environment(tmp_path: Path) -> None:
    """Started in a folder holding hmac.py, json.py and ssl.py (as a shared job folder or /tmp
    might), the boot imports none of them; it reads the console's address, the step's key and the
    run's TLS material from its stdin (as srun --input=all hands them over), so neither its
    /proc/<pid>/environ nor its starter's holds any of them, and its stdin is /dev/null afterwards."""
    job, markers = tmp_path / "job", tmp_path / "markers"
    job.mkdir()
    markers.mkdir()
    for name in PLANTED:
        (job / f"{name}.py").write_text(f"open({str(markers / name)!r}, 'w').close()\n")
    run, key = link_tls.make_run_tls(), os.urandom(32)
    got: list[bytes] = []
    port, console = _fake_console(run, key, _PROBE, got)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(job),  # ignored too (-I)
        sd.ENV_PYTHON: sys.executable,
    }
    line = sd.boot_line(f"127.0.0.1:{port}", key, run.cert, run.key)
    p = subprocess.run(
        ["/bin/sh", "-c", sd.DIAL_SH, sd.DIAL_BOOT],
        env=env,
        cwd=job,
        input=line,
        capture_output=True,
        timeout=60,
    )
    console.join(30)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert sorted(os.listdir(markers)) == []  # nothing planted ran
    assert got[0].split()[4].decode() == key_id(key) == dial.key_id(key)  # the boot names its key
    seen = eval(got[1].decode())  # noqa: S307 - our own probe's repr of plain values
    assert seen["isolated"] == 1 and seen["tls"] and str(job) not in seen["path"] and "" not in seen["path"]
    assert seen["stdin"] == os.devnull  # nothing the dial starts inherits the pipe
    environ = seen["environ"]
    for secret in (key.hex(), run.cert.encode().hex(), run.key.encode().hex(), str(port)):
        assert secret.encode() not in environ
    assert b"MSCON_DIAL" in environ  # the python's name, no secret: what the boot was started with
    assert b"PATH=" in environ  # the rest of the environment is kept


@pytest.mark.parametrize(
    "stdin",
    [
        b"",
        b"127.0.0.1:1 cafe\n",
        b"127.0.0.1:1 k c q",
        b"127.0.0.1:1 zz 00 00\n",
        b"x" * (sd.BOOT_LINE_MAX + 10),
    ],
    ids=["nothing", "two-words", "no-newline", "not-hex", "too-long"],
)
def test_a_boot_without_a_whole_key_line_on_stdin_exits_in_one_line(stdin: bytes) -> None:
    env = {"PATH": os.environ["PATH"], sd.ENV_PYTHON: sys.executable}
    p = subprocess.run(
        ["/bin/sh", "-c", sd.DIAL_SH, sd.DIAL_BOOT], env=env, input=stdin, capture_output=True, timeout=60
    )
    err = p.stderr.decode()
    assert p.returncode == 1 and err.startswith("mscon dial: no ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "key line on stdin" in err


def test_the_boot_line_is_one_line_of_four_words() -> None:
    run = link_tls.make_run_tls()
    line = sd.boot_line("10.0.0.1:4242", bytes(32), run.cert, run.key)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and len(line) < 4096  # fits one pipe page
    addr, key, cert, tls_key = line.split()
    assert (addr, key) == (b"10.0.0.1:4242", b"00" * 32) and bytes.fromhex(cert.decode()).decode() == run.cert
    assert bytes.fromhex(tls_key.decode()).decode() == run.key
    with pytest.raises(ValueError):
        sd.boot_line("a b:1", bytes(32), run.cert, run.key)
