"""The srun transport without Slurm: the dial-back handshake both ways, the dial's path checks,
the log extraction, and a whole ``mscon run`` through a stand-in ``srun`` (it runs the one task on
this machine, with the environment and stdin, as srun --export=ALL --input=all does)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import ssl
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from mscon.agent import dial, layout, tls
from mscon.console.config.inventory import load_inventory
from mscon.console.transport import link_tls
from mscon.console.transport import slurm as st
from mscon.console.transport import slurm_dial as sd
from mscon.console.transport import slurm_launcher as sl

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> sl.SlurmLauncher:
    monkeypatch.setenv(sl.ENV_CONSOLE_ADDRESS, "127.0.0.1")
    return sl.SlurmLauncher(load_inventory(REPO / "inventory" / "local.yaml"))


def _as_node(port: int, key: bytes, role: str = "boot", then: bytes = b"", material: object = None) -> bytes:
    """A node's connection: TLS with the run's certificate (``material``: a RunTls), then the key's
    proof; what the console sends after ``then``."""
    assert isinstance(material, link_tls.RunTls)
    s = tls.TlsSock(tls.connect("127.0.0.1", port, material.cert, material.key, 5))
    f = dial.Lines(s)
    try:
        dial.dial_handshake(s, f, key, role)
        s.sendall(then)
        return f.readline()
    finally:
        s.close()


async def test_both_sides_prove_the_key_and_only_then_code_is_sent(launcher: sl.SlurmLauncher) -> None:
    await launcher._listen()
    run = launcher.tls
    _, key = launcher.keys.new_step(frozenset({"n1"}))
    try:
        # A node with a key the console does not hold gets no proof, only the end (a console that
        # answers with a wrong proof is refused by the node: test_boot_refuses_...) ...
        with pytest.raises(EOFError, match="closed the connection before its proof"):
            await asyncio.to_thread(_as_node, launcher.port, os.urandom(32), material=run)
        # ... and with the key, the first thing after the handshake is the dial's source.
        first = await asyncio.to_thread(_as_node, launcher.port, key, material=run)
        assert int(first) == len(sd.dial_source())

        def wrong_proof() -> bytes:
            s = tls.TlsSock(tls.connect("127.0.0.1", launcher.port, run.cert, run.key, 5))
            f = dial.Lines(s)
            s.sendall(f"MSCON-DIAL 1 boot 00112233 {dial.key_id(key)}\n".encode())
            f.readline()  # the console's nonce and proof
            s.sendall(b"0" * 64 + b"\n")
            rest = f.readline()
            s.close()
            return rest

        assert await asyncio.to_thread(wrong_proof) == b""  # closed, nothing sent
        # An agent connection with the step's key gets nothing (a node's own key proves those).
        with pytest.raises(EOFError):
            await asyncio.to_thread(_as_node, launcher.port, key, "agent", b"f00d\n", run)
        # A node with the key but another certificate: refused by TLS, before any line.
        with pytest.raises(ssl.SSLError):
            await asyncio.to_thread(_as_node, launcher.port, key, material=link_tls.make_run_tls())
    finally:
        await launcher.close()


def _run_boot(port: int, material: link_tls.RunTls) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], sd.ENV_PYTHON: sys.executable}
    line = sd.boot_line(f"127.0.0.1:{port}", os.urandom(32), material.cert, material.key)
    return subprocess.run(
        ["/bin/sh", "-c", sd.DIAL_SH, sd.DIAL_BOOT],
        env=env,
        input=line.decode(),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_boot_refuses_a_console_without_the_key() -> None:
    run = link_tls.make_run_tls()
    srv = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def fake_console() -> None:
        raw, _ = srv.accept()
        conn = tls.server_context(run.cert, run.key).wrap_socket(raw, server_side=True)
        with conn, conn.makefile("rb") as f:
            seen.append(f.readline())
            conn.sendall(b"cafe " + b"0" * 64 + b"\n")
            seen.append(f.read())  # what the node sends after a wrong proof: nothing

    t = threading.Thread(target=fake_console, daemon=True)
    t.start()
    p = _run_boot(srv.getsockname()[1], run)
    t.join(10)
    srv.close()
    assert p.returncode == 1 and "the console did not authenticate" in p.stderr
    assert seen[0].startswith(b"MSCON-DIAL 1 boot ") and seen[1] == b""


def test_boot_refuses_a_console_with_another_certificate_before_any_line() -> None:
    run, other = link_tls.make_run_tls(), link_tls.make_run_tls()
    srv = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def fake_console() -> None:
        raw, _ = srv.accept()
        try:
            conn = tls.server_context(other.cert, other.key).wrap_socket(raw, server_side=True)
            seen.append(conn.recv(100))
        except (OSError, ssl.SSLError):
            seen.append(b"refused")
        raw.close()

    t = threading.Thread(target=fake_console, daemon=True)
    t.start()
    p = _run_boot(srv.getsockname()[1], run)
    t.join(10)
    srv.close()
    assert p.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in p.stderr, p.stderr
    assert seen == [b"refused"]


def test_dial_paths_stay_in_the_mscon_folder(tmp_path: Path) -> None:
    d = dial.Dial(None, None, b"")
    d.root = str(tmp_path)
    assert d.path("agent-1/mscon_agent/main.py") == str(tmp_path / "agent-1" / "mscon_agent" / "main.py")
    for bad in ("../x", "a/../b", "/etc/passwd", "", "a//b", "a/\x01", None, 5):
        with pytest.raises(ValueError):
            d.path(bad)


def test_put_is_atomic_and_fetch_never_follows_links(tmp_path: Path) -> None:
    sent: list[dict] = []
    d = dial.Dial(None, None, b"")
    d.root = str(tmp_path / "cache")
    d.send = sent.append  # type: ignore[method-assign]
    old = os.umask(0)  # its defaults would open everything to everyone
    try:
        d.put("sync/a.tar.gz", b"12", last=False)
        assert not (tmp_path / "cache" / "sync" / "a.tar.gz").exists()  # not before the last part
        d.put("sync/a.tar.gz", b"34", last=True)
    finally:
        os.umask(old)
    assert (tmp_path / "cache" / "sync" / "a.tar.gz").read_bytes() == b"1234"
    # Private whatever the umask (issue 33): the folders it made 0700, the file 0600.
    modes = [oct(p.stat().st_mode & 0o777) for p in (tmp_path / "cache", tmp_path / "cache" / "sync")]
    assert modes + [oct((tmp_path / "cache" / "sync" / "a.tar.gz").stat().st_mode & 0o777)] == [
        "0o700",
        "0o700",
        "0o600",
    ]
    run = Path(layout.run_folder(d.root, "r", "n"))
    attempt = Path(layout.attempt_folder(run, 0))
    attempt.mkdir(parents=True)
    Path(layout.log_file(attempt, "r0")).write_text("hello\n")
    work = Path(layout.work_folder(str(run)))
    work.mkdir()
    (work / "secret.py").write_text("no")
    (tmp_path / "outside").write_text("outside")
    (attempt / "link.log").symlink_to(tmp_path / "outside")
    (run / "escape").symlink_to(tmp_path)
    d.fetch(1, str(run))
    data = b"".join(base64.b64decode(m["chunk"]) for m in sent)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = sorted(m.name for m in tar.getmembers())
    assert names == [layout.attempt_name(0), layout.log_path("", 0, "r0")]


def test_extract_writes_plain_files_only(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (
            ("ok/r0.log", b"log"),
            ("../evil", b"x"),
            ("work/w.py", b"x"),
            ("a/\x1b[2J", b"x"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("ok/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    buf.seek(0)
    dest = tmp_path / "dest"
    dest.mkdir()
    st._extract(buf, dest)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["ok", "ok/r0.log"]
    assert not (tmp_path / "evil").exists()


FAKE_SRUN = """#!/bin/sh
# srun for one node on this machine: drop srun's options, run the task with srun's environment and stdin.
echo "$@" > "$FAKE_SRUN_ARGV"
while [ $# -gt 0 ]; do case "$1" in --*) shift;; *) break;; esac; done
SLURMD_NODENAME=fakenode SLURM_PROCID=0 exec "$@"
"""
FAKE_SQUEUE = '#!/bin/sh\ncase "$*" in *" -s "*) exit 0;; *) echo RUNNING;; esac\n'
FAKE_SCONTROL = "#!/bin/sh\necho fakenode\n"


def test_a_run_through_a_stand_in_srun(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("squeue", FAKE_SQUEUE), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        json.dumps(
            {
                "name": "fake-slurm",
                "device_target": "CPU",
                "defaults": {"python": sys.executable},
                "nodes": {"from": "slurm"},
                "scheduler": {"port": 18000 + os.getpid() % 2000},
                "job": {"workdir": str(REPO), "script": "bench/fake_rank.py", "args": ["--steps", "5"]},
                "stop": {"grace_s": 1},
            }
        )
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "fakenode",
        "SLURM_NTASKS_PER_NODE": "2",
        "FAKE_SRUN_ARGV": str(tmp_path / "argv"),
        sl.ENV_CONSOLE_ADDRESS: "127.0.0.1",
    }
    p = subprocess.run(
        [sys.executable, "-m", "mscon.console.cli", "run", "--no-tui", "--no-check", str(inv)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[fakenode r1] epoch: 1 step: 5," in p.stdout
    argv = (tmp_path / "argv").read_text()
    assert argv.startswith("--overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpu-bind=none")
    assert " --input=all " in argv  # the boot's line reaches every task
    assert sys.executable not in argv and "fake-slurm" not in argv and "fakenode" not in argv
    fetched = list((tmp_path / layout.LOGS_DIR).glob(layout.log_path("*/fakenode", 0, "r1")))
    assert len(fetched) == 1 and "training finished" in fetched[0].read_text()
