"""Issue 45 on a real Slurm allocation: nothing runs through srun that mscon did not ship, and the
dial's keys live as long as their use.

Another local user plants hmac.py, json.py and ssl.py (each leaves a marker when imported) in the
folder the console starts from and in /tmp (where Slurm runs a step whose folder a node lacks); a
run through mscon works and no marker appears. While it runs, no process (srun on the console's
side, slurmstepd, the dial, the agent, a rank) holds the step's key or the run's TLS material in its
environment: the console writes them on srun's stdin. A relaunch step gets a key of its own, and a
second "boot" for a node that booted (someone who read the step's key off that pipe: a stand-in
srun keeps a copy, test_slurm.capturing_srun) is refused, and said as the node's error.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import run_processes, wait_for
from mscon.agent import dial, tls
from mscon.console.transport import slurm_dial as sd
from mscon.console.transport.slurm_launcher import STEP_CWD
from second_user import intruder_uid
from test_slurm import (
    FAKE,
    Alloc,
    _dials,
    _inventory,
    _srun_of,
    _wait_for_line,
    _wait_no_step,
    alloc,
    boot_lines,
    capturing_srun,
    no_dial_value_in_any_environment,
    slurm,
)

__all__ = ["alloc", "slurm"]  # the fixtures, from test_slurm.py

PLANTED = ("hmac", "json", "ssl")


def _planted_source(markers: Path, name: str) -> str:
    """A module that leaves a marker (naming the process) and then hands over to the real one, so
    that a process of someone else that imports it meanwhile keeps working."""
    return (
        "import os, sys\n"
        f"with open(os.path.join({str(markers)!r}, {name!r} + '-' + str(os.getpid())), 'w') as m:\n"
        "    m.write(open('/proc/self/cmdline', 'rb').read().replace(bytes(1), b' ').decode()[:300])\n"
        "_here = os.path.dirname(os.path.abspath(__file__))\n"
        f"del sys.modules[{name!r}]\n"
        "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != _here]\n"
        "import importlib\n"
        f"sys.modules[{name!r}] = importlib.import_module({name!r})\n"
    )


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The console's folder and the markers' folder; the modules planted there and in /tmp, owned
    by another local user and world-readable, removed afterwards."""
    uid = intruder_uid()
    if uid is None:
        pytest.skip("no second local user (useradd failed and there is no 'nobody')")
    console_dir, markers = tmp_path / "console", tmp_path / "markers"
    console_dir.mkdir()
    markers.mkdir(mode=0o777)
    markers.chmod(0o777)  # whoever runs a planted module can leave its marker
    made: list[Path] = []
    try:
        for folder in (console_dir, Path("/tmp")):
            for name in PLANTED:
                path = folder / f"{name}.py"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # none of ours there
                made.append(path)
                with os.fdopen(fd, "w") as f:
                    f.write(_planted_source(markers, name))
                os.chown(path, uid, uid)
                path.chmod(0o644)
        yield console_dir, markers
    except FileExistsError as exc:
        pytest.skip(f"{exc.filename} exists already: not ours to replace")
    finally:
        for path in made:
            path.unlink(missing_ok=True)


def _console(*args: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    # -I: the console's own interpreter is not what this test is about (the planted folder is its cwd).
    return subprocess.Popen(
        [sys.executable, "-I", "-m", "mscon.console.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def _no_dial_values(proc: psutil.Process, values: tuple[str, ...]) -> None:
    env = proc.environ()
    assert not any(k.startswith("MSCON_DIAL") and k != sd.ENV_PYTHON for k in env), (proc, sorted(env))
    raw = Path(f"/proc/{proc.pid}/environ").read_bytes()
    for value in values:
        assert value.encode() not in raw, (proc, proc.cmdline()[:3])


def test_planted_modules_never_run_and_no_key_is_in_any_environment(
    tmp_path: Path, alloc: Alloc, planted: tuple[Path, Path]
) -> None:
    console_dir, markers = planted
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "200", "--rate", "20"])
    run_id = f"iso-{secrets.token_hex(3)}"
    env = capturing_srun(tmp_path / "capture", alloc.env)
    proc = _console(
        "run", "--no-tui", "--no-check", inv, "--run-id", run_id, "--json", tmp_path / "s.json",
        cwd=console_dir, env=env,
    )  # fmt: skip
    try:
        _wait_for_line(proc, "r1] epoch: 1 step: 3,")
        srun = _srun_of(proc)
        # srun on the console's machine: no value of the dial's but the python in its environment.
        assert not [k for k in srun.environ() if k.startswith("MSCON_DIAL") and k != sd.ENV_PYTHON]
        ((_, key, cert, tls_key),) = boot_lines(tmp_path / "capture")  # what its stdin carried
        assert len(key) == 64 and bytes.fromhex(cert).startswith(b"-----BEGIN CERTIFICATE-----")
        values = (key, cert, tls_key)
        (boot,) = _dials(alloc, alloc.cluster.node)
        assert boot.cmdline()[1] == "-I" and boot.cwd() == STEP_CWD
        agents = [c for c in boot.children() if c.cmdline()[1:2] == ["-c"]]
        ranks = run_processes(run_id)
        assert len(agents) == 1 and len(ranks) >= 2, (agents, ranks)
        for p in (srun, boot, *agents, *ranks):
            _no_dial_values(p, values)
        # Nor any other process of this machine (slurmstepd, slurmd, the console itself).
        assert no_dial_value_in_any_environment(values) > len(ranks) + 3
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert sorted(r["last_step"] for r in s["ranks"] if r["rank"] >= 0) == [200, 200]
    assert sorted(p.name for p in markers.iterdir()) == [], {p.name: p.read_text() for p in markers.iterdir()}
    assert _wait_no_step(alloc, 10) == []


def _boot_as(address: str, tls_cert: str, tls_key: str, step_key: bytes, host: str) -> bytes:
    """What someone who read the step's line off srun's stdin can do: say "boot" for ``host`` with the
    step's key. What the console sends after the hello (b"": it closed the connection)."""
    host_ip, _, port = address.rpartition(":")
    s = tls.TlsSock(tls.connect(host_ip, int(port), tls_cert, tls_key, 10))
    try:
        lines = dial.Lines(s)
        dial.dial_handshake(s, lines, step_key, "boot")
        size, got = int(lines.readline()), b""
        while len(got) < size:
            got += lines.readline(size - len(got))
        hello = {"op": "hello", "node": host, "hostname": host, "home": "/root", "pid": 1}
        s.sendall((json.dumps(hello) + "\n").encode())
        try:
            return lines.readline()
        except OSError:
            return b""
    finally:
        s.close()


def test_relaunch_steps_get_keys_of_their_own_and_a_second_boot_is_refused(
    tmp_path: Path, alloc: Alloc
) -> None:
    """The node's dial killed: the restart's step has a key of its own. Then someone holding that
    step's key (a copy of the line on srun's stdin) says "boot" for the node once more: it is
    refused, the node's connections are closed, and the run's summary says why."""
    node = alloc.cluster.node
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "100000", "--rate", "20"])
    capture = tmp_path / "capture"
    proc = _console(
        "run", "--no-tui", "--no-check", inv, "--max-restarts", "1", "--json", tmp_path / "s.json",
        cwd=tmp_path, env=capturing_srun(capture, alloc.env),
    )  # fmt: skip
    try:
        _wait_for_line(proc, "r0] epoch: 1 step: 3,")
        first = _srun_of(proc)
        _dials(alloc, node)[0].kill()
        # the restart's step: a new srun, with a new key
        wait_for(lambda: next((p for p in [_srun_of(proc)] if p.pid != first.pid), None), 90, "a second srun")
        _wait_for_line(proc, "r0] epoch: 1 step: 3,")  # the restart runs
        (_, key1, _, _), (addr, key2, cert_hex, tls_key_hex) = boot_lines(capture)
        assert key2 != key1 and len(key2) == 64
        t0 = time.monotonic()
        cert, tls_key = (bytes.fromhex(v).decode() for v in (cert_hex, tls_key_hex))
        sent = _boot_as(addr, cert, tls_key, bytes.fromhex(key2), node)
        assert sent == b""  # no key of the node's, nothing else
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode != 0, err[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    reasons = [a.get("reason", "") for a in s["attempts"]]
    assert any(f"{node}: refused a second boot for this node from" in r for r in reasons), s["attempts"]
    assert _wait_no_step(alloc, 15) == []
    print(f"a second boot refused; the run ended {took:.2f} s later")
