"""The kept standby (agent/keeper.py, agent/kept.py, Spares.adopt) with stand-in spares: a small
script that says it joined (its marker) and then does what its order says. What the keeper holds,
when the next run may adopt it, how the ranks it becomes are watched (exit statuses relayed by
the keeper), and that nothing outlives what it should: the TTL, a drop, an adopter that goes.
The real thing, MindSpore spares joined to their own cluster: tests/e2e/test_kept_standby.py."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import wait_for, wait_gone
from mscon.agent import kept, layout
from mscon.agent.protocol import ProcSpec, StandbyPhase, on_standby
from mscon.agent.spares import Spares
from node_files import listing, loose

FAKE_BOOT = """\
import json, os, sys, time
while os.environ.get("HOLD_UNTIL") and not os.path.exists(os.environ["HOLD_UNTIL"]):
    time.sleep(0.02)  # still joining
if sys.argv[1:2] == ["--join"]:
    open(sys.argv[2], "w").close()
line = sys.stdin.readline().strip()
if not line:
    sys.exit(0)
with open(line) as f:
    order = json.load(f)
with open(order["log"], "a") as f:
    f.write("became %s in %s\\n" % (order["argv"][1], order["cwd"]))
sys.exit(int(order["env"].get("EXIT_CODE", "0")))
"""

PY = (sys.executable, "train.py")
SPECS = (
    ProcSpec("sched", -1, -1, PY, {"MS_SCHED_PORT": "20000", "MS_ROLE": "MS_SCHED"}),
    ProcSpec("r0", 0, 0, PY, {"MS_SCHED_PORT": "20000", "MS_ROLE": "MS_WORKER", "EXIT_CODE": "3"}),
)


def _run_dir(home: Path, run_id: str) -> str:
    path = layout.run_folder(str(home / ".cache/mscon"), run_id, "n1")
    os.makedirs(layout.attempt_folder(path, 0), exist_ok=True)
    return path


def _start_keeper(
    home: Path, ttl_s: float = 120.0, specs: tuple = SPECS, stderr: int | None = None
) -> tuple[str, subprocess.Popen]:
    """A keeper as ``kept.keep`` starts one, for a run in ``run-1``, with stand-in spares."""
    old = _run_dir(home, "run-1")
    folder = layout.kept_folder(old, "n1")
    os.makedirs(folder, mode=0o700)
    boot = home / "boot.py"
    boot.write_text(FAKE_BOOT)
    procs = []
    for spec in (on_standby(s, 0) for s in specs):
        marker = os.path.join(folder, spec.name + ".joined")
        procs.append(
            {
                "name": spec.name,
                "argv": list(spec.argv),
                "boot_argv": [sys.executable, str(boot), "--join", marker],
                "env": kept.first_attempt_env(spec, old),
                "cwd": str(home),
                "log": os.path.join(folder, spec.name + ".log"),
                "marker": marker,
                "scheduler": spec.is_scheduler,
            }
        )
    order = {"folder": folder, "ttl_s": ttl_s, "kept_by": old, "procs": procs}
    popen = subprocess.Popen(
        [sys.executable, kept.KEEPER],
        cwd=folder,
        stdin=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
    )
    assert popen.stdin is not None
    popen.stdin.write(json.dumps(order).encode())
    popen.stdin.close()
    return folder, popen


def _ready(folder: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client = kept.connect(folder)
        if client is not None:
            state = client.ask({"op": "state"})
            client.close()
            if state and state["ready"]:
                return
        time.sleep(0.05)
    raise AssertionError(f"the keeper in {folder} never said ready")


def _held(keeper: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(keeper.pid).children()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for pidfile in tmp_path.glob(".cache/mscon/warm/*/keeper.pid"):  # a failed case leaves none running
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_the_next_run_adopts_it_and_its_ranks_exits_are_relayed(home: Path) -> None:
    folder, keeper = _start_keeper(home)
    _ready(folder)
    held = _held(keeper)
    assert len(held) == 2
    new = _run_dir(home, "run-2")  # another run: its metrics files differ, the job does not
    specs = tuple(on_standby(s, 0) for s in SPECS)
    spares = Spares()
    assert spares.adopt(folder, new, str(home), specs) is None
    assert spares.missing(specs, new, 0, str(home)) is None
    sched = spares.take(specs[0], new, 0, str(home))
    r0 = spares.take(specs[1], new, 0, str(home))
    assert sched is not None and r0 is not None
    spares.discard()  # none left untaken: the keeper stays (it reaps the ranks)
    assert keeper.poll() is None
    # The scheduler serves from its start and reads no order: its kept log is the attempt's.
    assert Path(sched.log_path).samefile(os.path.join(folder, "sched.log"))
    deadline = time.monotonic() + 30
    while not r0.poll() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r0.returncode == 3  # the order's environment (EXIT_CODE), the exit relayed
    assert Path(r0.log_path).read_text() == f"became train.py in {home}\n"
    deadline = time.monotonic() + 30
    while not sched.poll() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sched.returncode == 0  # its input ended (no order): done serving, it exits as it is
    for c in list(kept._open):
        c.close()  # the agent leaves: the keeper has nothing left to hold
    assert keeper.wait(30) == 0
    assert not os.path.exists(os.path.join(folder, kept.SOCKET))


def test_a_job_that_differs_is_not_adopted_and_the_keeper_ends(home: Path) -> None:
    folder, keeper = _start_keeper(home)
    _ready(folder)
    held = _held(keeper)
    changed = tuple(on_standby(s, 0) for s in SPECS)
    changed = (changed[0], ProcSpec("r0", 0, 0, PY, {**changed[1].env, "GLOG_v": "1"}))
    why = Spares().adopt(folder, _run_dir(home, "run-2"), str(home), changed)
    assert why == "r0's environment differs in GLOG_v"
    assert keeper.wait(30) == 0
    assert wait_gone(held, 10) == []


def test_unclaimed_it_ends_at_its_ttl(home: Path) -> None:
    folder, keeper = _start_keeper(home, ttl_s=3.0)
    _ready(folder)
    held = _held(keeper)
    assert keeper.wait(60) == 0
    assert wait_gone(held, 10) == []
    assert kept.connect(folder) is None


def test_its_adopter_gone_the_ranks_go_too(home: Path) -> None:
    """A crashed console's agent: the ranks the keeper holds for it hold devices: they are killed."""
    folder, keeper = _start_keeper(home)
    _ready(folder)
    held = _held(keeper)
    spares = Spares()
    specs = tuple(on_standby(s, 0) for s in SPECS)
    assert spares.adopt(folder, _run_dir(home, "run-2"), str(home), specs) is None
    assert spares.take(specs[0], _run_dir(home, "run-2"), 0, str(home)) is not None  # the scheduler runs on
    for c in list(kept._open):
        c.close()
    assert keeper.wait(30) == 0
    assert wait_gone(held, 10) == []


def test_another_run_cannot_take_or_end_an_adopted_one(home: Path) -> None:
    folder, keeper = _start_keeper(home)
    _ready(folder)
    first = kept.connect(folder)
    assert first is not None and first.ask({"op": "adopt"}) == {"adopted": True}
    second = kept.connect(folder)
    assert second is not None and second.ask({"op": "state"}) is None and second.busy
    kept.drop(folder)  # what a cold first attempt of another run does: not this run's to end
    assert keeper.poll() is None
    first.drop()
    assert keeper.wait(30) == 0


def test_a_spare_lost_before_adoption_ends_the_standby(home: Path) -> None:
    folder, keeper = _start_keeper(home)
    _ready(folder)
    held = {p.pid: p for p in _held(keeper)}
    os.killpg(min(held), signal.SIGKILL)  # all or nothing: the cluster it joined is broken
    assert keeper.wait(30) == 0
    assert wait_gone(list(held.values()), 10) == []


def test_a_run_that_comes_while_it_joins_takes_it_once_joined(home: Path) -> None:
    go = home / "joined-now"
    specs = (SPECS[0], ProcSpec("r0", 0, 0, PY, {**SPECS[1].env, "HOLD_UNTIL": str(go)}))
    folder, keeper = _start_keeper(home, specs=specs)
    pidfile = os.path.join(folder, kept.PIDFILE)
    wait_for(lambda: os.path.exists(pidfile), 30, "the keeper to serve (its pid file)")  # r0 has not joined
    spares = Spares()
    assert (
        spares.adopt(folder, _run_dir(home, "run-2"), str(home), tuple(on_standby(s, 0) for s in specs))
        is None
    )
    assert spares.poll() == (StandbyPhase.JOINING, "")  # taken, not ready: the policy waits for it
    assert spares.poll() is None  # said once
    go.touch()
    deadline = time.monotonic() + 30
    said = None
    while said is None and time.monotonic() < deadline:
        said = spares.poll()
        time.sleep(0.02)
    assert said == (StandbyPhase.READY, "")
    spares.discard()  # the attempt went cold after all (another node's was not ready): it ends
    assert keeper.wait(30) == 0


def test_a_stale_pid_file_names_no_keeper(home: Path) -> None:
    """A killed keeper leaves keeper.pid: its pid, reused by another process, is never waited on
    or killed as the keeper."""
    folder = layout.kept_folder(_run_dir(home, "run-1"), "n1")
    os.makedirs(folder)
    other = subprocess.Popen(["sleep", "60"])
    try:
        Path(folder, kept.PIDFILE).write_text(f"{other.pid}\n")
        t0 = time.monotonic()
        kept.drop(folder)
        assert other.poll() is None and time.monotonic() - t0 < 5
    finally:
        other.kill()
        other.wait()


def test_run_specific_keys_do_not_make_another_job() -> None:
    a = {"MSCON_METRICS": "/a/r0.metrics.jsonl", "SSH_CONNECTION": "1 2 3 4", "PATH": "/bin", "GLOG_v": "3"}
    b = {"MSCON_METRICS": "/b/r0.metrics.jsonl", "SSH_CONNECTION": "5 6 7 8", "PATH": "/bin", "GLOG_v": "3"}
    assert kept.same_job_env(a, b) is None
    assert kept.same_job_env(a, {**b, "PATH": "/usr/bin"}) == "PATH"
    assert kept.same_job_env(a, {**b, "EXTRA": "1"}) == "EXTRA"


# ------------------------------------------------------------------ its socket under pressure


def _sockets(pid: int) -> int:
    """The sockets a process holds (a keeper: its listener, and its client's if it has one)."""
    fds = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(fds):
        try:
            count += os.readlink(f"{fds}/{fd}").startswith("socket:")
        except FileNotFoundError:
            continue  # closed since the listing
    return count


def _lowest_free_fd(pid: int) -> int:
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return next(n for n in range(len(used) + 1) if n not in used)


def test_it_survives_running_out_of_descriptors_and_serves_again(home: Path) -> None:
    """accept() failing with EMFILE (its descriptor limit lowered to what it holds, as a node short
    of descriptors does to it) used to end the keeper, and its spares with it."""
    folder, keeper = _start_keeper(home, stderr=subprocess.PIPE)
    _ready(folder)
    held = _held(keeper)
    proc = psutil.Process(keeper.pid)
    soft, hard = proc.rlimit(psutil.RLIMIT_NOFILE)
    # _ready's client closed its end: the keeper closes its own once it reads that. Until then that
    # descriptor is not to spare, and would take the next client in once closed.
    wait_for(lambda: _sockets(keeper.pid) == 1, 10, "the keeper to drop _ready's client")
    proc.rlimit(psutil.RLIMIT_NOFILE, (_lowest_free_fd(keeper.pid), hard))  # no descriptor to spare
    client = kept.connect(folder)  # queued in the backlog: the keeper cannot take it
    assert client is not None
    assert keeper.stderr is not None
    readable, _, _ = select.select([keeper.stderr], [], [], 30)  # a keeper that took it says nothing
    assert readable, "the keeper did not say it cannot accept"
    said = keeper.stderr.readline().decode()
    assert "cannot accept (Too many open files)" in said, said
    assert keeper.poll() is None and all(p.is_running() for p in held)
    proc.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))  # descriptors again: the waiting client is served
    state = client.ask({"op": "state"})
    assert state is not None and state["ready"] and sorted(state["procs"]) == ["r0", "sched"]
    assert client.drop()
    assert keeper.wait(30) == 0
    assert wait_gone(held, 10) == []


def test_a_client_sending_an_overlong_line_is_dropped_and_it_serves_on(home: Path) -> None:
    import socket

    from mscon.agent import keeper as keeper_mod

    folder, keeper = _start_keeper(home)
    _ready(folder)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.path.join(folder, kept.SOCKET))
    sock.settimeout(30)
    try:
        sock.sendall(b"x" * (4 * keeper_mod.LINE_MAX))  # no newline, ever
    except (BrokenPipeError, ConnectionResetError):
        pass  # dropped while still sending: what the test wants
    try:
        assert sock.recv(1) == b""  # closed on it, nothing said
    except ConnectionResetError:
        pass
    sock.close()
    assert keeper.poll() is None
    client = kept.connect(folder)
    assert client is not None
    state = client.ask({"op": "state"})
    assert state is not None and state["ready"], state
    assert client.drop()
    assert keeper.wait(30) == 0


# A spare that makes its marker as spare_boot.py does (its own function), then waits for its order.
PRIVATE_BOOT = """\
import os, runpy, sys
boot = runpy.run_path(%r, run_name="spare_boot")  # its functions, not its main
os.close(boot["_private"](sys.argv[2]))  # the marker, as _join makes it once joined
sys.stdin.readline()
"""


def test_a_kept_standby_writes_only_private_files_under_any_umask(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its folder, socket, pid file, error file, spare logs and markers: 0700 and 0600 even under a
    umask that takes nothing away (the keeper and its spares inherit it)."""
    fake = home / "private_boot.py"
    fake.write_text(PRIVATE_BOOT % kept.BOOT)
    monkeypatch.setattr(kept, "BOOT", str(fake))
    run_dir = _run_dir(home, "run-1")
    old = os.umask(0)
    try:
        assert kept.keep(SPECS, run_dir, "n1", 120.0) is None
    finally:
        os.umask(old)
    folder = Path(layout.kept_folder(run_dir, "n1"))
    _ready(str(folder))
    names = sorted(p.name for p in folder.iterdir())
    assert {"keeper.sock", "keeper.pid", "keeper.err", "r0.log", "r0.joined", "sched.log"} <= set(names)
    assert loose(folder.parent) == [], listing(folder.parent)
    kept.drop(str(folder))
    assert kept.connect(str(folder)) is None
