"""Shared fixtures: real sshd nodes, inventories written for them, and running the `mscon` CLI."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import posixpath
import pwd
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
import yaml
from mscon.agent import layout

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

from sshd_nodes import SshdCluster, find_free_port, require_sshd, start_sshd_cluster  # noqa: E402

FAKE_RANK = REPO / "bench" / "fake_rank.py"
TRAINER = REPO / "trainer" / "train.py"


def mindspore_missing() -> str | None:
    try:
        import mindspore  # noqa: F401
    except ImportError as exc:  # pragma: no cover - CI installs it
        return f"MindSpore is not installed in this Python ({exc}); install with: pip install '.[train]'"
    return None


needs_mindspore = pytest.mark.skipif(mindspore_missing() is not None, reason=mindspore_missing() or "")


def _sshd_nodes(tmp_path: Path, n: int) -> Iterator[SshdCluster]:
    require_sshd()
    cluster = start_sshd_cluster(tmp_path / "sshd", n=n)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def sshd_cluster(tmp_path: Path) -> Iterator[SshdCluster]:
    yield from _sshd_nodes(tmp_path, 2)


@pytest.fixture
def sshd_node(tmp_path: Path) -> Iterator[SshdCluster]:
    """One sshd node."""
    yield from _sshd_nodes(tmp_path, 1)


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[SshdCluster]:
    """Three sshd nodes: a bastion and two nodes behind it (test_ssh_known_hosts.behind_bastion)."""
    yield from _sshd_nodes(tmp_path, 3)


SSH_USER = "root"  # the only user the sshd nodes accept


SLOW_TESTS = "MSCON_SLOW_TESTS"


def slow_twin(why: str) -> pytest.MarkDecorator:
    """A test that repeats what another test covers (``why`` names it): the README's command skips
    it, saying so, to stay within its time; ``MSCON_SLOW_TESTS=1`` runs it."""
    return pytest.mark.skipif(not os.environ.get(SLOW_TESTS), reason=f"{why}: {SLOW_TESTS}=1 runs it")


def node_home(user: str | None = SSH_USER) -> Path:
    """The home a node's agent keeps its runs under (``agent/layout.py``). An sshd node's agent
    runs in ``user``'s passwd home (sshd sets HOME from it, whatever this process's HOME is); a
    local node's (``user`` None) in this process's HOME, which mscon and its local agent inherit."""
    return Path(pwd.getpwnam(user).pw_dir) if user else Path.home()


def node_run_dir(run_id: str, node: str, user: str | None = SSH_USER) -> Path:
    """A node's folder of a run (logs under ``layout.log_path(it, attempt, name)``)."""
    return Path(layout.run_folder(layout.cache_folder(str(node_home(user))), run_id, node))


def free_port() -> int:
    """A port free now, and the two above it (sshd_nodes.find_free_port)."""
    return find_free_port(["0.0.0.0"])


def write_inventory(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def ssh_inventory(
    path: Path,
    cluster: SshdCluster,
    devices: int,
    script: str,
    args: list[str],
    workdir: Path = REPO,
    grace_s: float = 2.0,
) -> Path:
    return write_inventory(
        path,
        {
            "name": "loopback",
            "device_target": "CPU",
            "defaults": {
                "user": SSH_USER,
                "port": cluster.port,
                "identity_file": str(cluster.client_key),
                "python": sys.executable,
            },
            "nodes": [{"host": n.host, "name": n.name, "devices": devices} for n in cluster.nodes],
            "scheduler": {"port": free_port()},
            "job": {"workdir": str(workdir), "script": script, "args": args},
            "ssh": {"known_hosts": str(cluster.known_hosts), "connect_timeout_s": 5},
            "stop": {"grace_s": grace_s},
        },
    )


def use_ssh_config_aliases(inv: Path, cluster: SshdCluster) -> Path:
    """Rewrite an ssh_inventory so its nodes are known only as ssh config aliases ("node1-alias":
    HostName, Port, User and IdentityFile in an ssh config beside it), as users name their nodes."""
    config = inv.with_name("ssh_config")
    config.write_text(
        "".join(
            f"Host {n.name}-alias\n  HostName {n.host}\n  Port {n.port}\n  User {SSH_USER}\n"
            f"  IdentityFile {cluster.client_key}\n"
            for n in cluster.nodes
        )
    )
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"] = {"python": doc["defaults"]["python"]}  # user, port and key come from the config
    doc["nodes"] = [{"host": f"{n.name}-alias", "name": n.name, "devices": 1} for n in cluster.nodes]
    doc["ssh"]["config"] = str(config)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def local_inventory(path: Path, devices: int, script: str, args: list[str], workdir: Path = REPO) -> Path:
    return write_inventory(
        path,
        {
            "name": "local-test",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": devices}],
            "scheduler": {"port": free_port()},
            "job": {"workdir": str(workdir), "script": script, "args": args},
            "stop": {"grace_s": 2},
        },
    )


@dataclass
class Done:
    code: int
    out: str
    err: str


def mscon(*args: str | Path, cwd: Path, timeout: float = 240, env: dict[str, str] | None = None) -> Done:
    p = subprocess.run(
        [sys.executable, "-m", "mscon.console.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Done(p.returncode, p.stdout, p.stderr)


def mscon_popen(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mscon.console.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def run_processes(run_id: str) -> list[psutil.Process]:
    """Live (non-zombie) processes launched for a run: ranks and scheduler carry its id in MSCON_METRICS.
    Spares waiting to become the next attempt's ranks (agent/spares.py, process name mscon-spare)
    are not processes of an attempt."""
    found = []
    for p in psutil.process_iter(["pid", "status", "name"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.info["name"] == "mscon-spare":
                continue
            if run_id in p.environ().get("MSCON_METRICS", ""):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def wait_run_processes(run_id: str, count: int, timeout: float) -> list[psutil.Process]:
    """The run's processes (``run_processes``), once at least ``count`` of them run."""
    return wait_for(
        lambda: found if len(found := run_processes(run_id)) >= count else [],
        timeout,
        f"{count} processes of run {run_id}",
        lambda: f"{len(run_processes(run_id))} running",
    )


def run_process(run_id: str, attempt: int, name: str) -> psutil.Process | None:
    """A process of the run by attempt and name, spare-born or not (its MSCON_METRICS says)."""
    want = os.sep + f"{layout.ATTEMPT_PREFIX}{attempt}" + os.sep + name + layout.METRICS_SUFFIX
    for p in psutil.process_iter():
        try:
            metrics = p.environ().get("MSCON_METRICS", "")
            if run_id in metrics and metrics.endswith(want) and p.status() != psutil.STATUS_ZOMBIE:
                return p
        except (psutil.Error, OSError):
            continue
    return None


def agent_processes(node_names: list[str], roots: list[int] | None = None) -> list[psutil.Process]:
    """Live agents. Node names travel on the agent's stdin, not its command line, so a test scopes
    them by ancestry instead: ``roots`` are the pids (sshd nodes, the mscon process) they descend
    from. Without roots every agent on the machine counts."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] == psutil.STATUS_ZOMBIE or not any("mscon_agent" in w for w in cmd):
            continue
        if any(w.endswith(("spare_boot.py", "keeper.py")) for w in cmd):  # spares and their keeper
            continue
        if roots is not None:
            try:
                if not {a.pid for a in p.parents()} & set(roots):
                    continue
            except psutil.Error:
                continue
        found.append(p)
    return found


def kill_run(run_id: str) -> None:
    """Kill what a detached run left (its daemon agents chdir into their run folders, and their
    ranks die with them): a failed test must not leave a run training for hours."""
    roots = tuple(
        posixpath.join(layout.runs_root(layout.cache_folder(str(node_home(user)))), run_id, "")
        for user in (SSH_USER, None)
    )
    for p in agent_processes([]):
        try:
            if p.cwd().startswith(roots):
                p.kill()
        except psutil.Error:
            continue
    for p in run_processes(run_id):
        with contextlib.suppress(psutil.Error):
            p.kill()


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process is gone (zombies count as gone); returns the survivors."""
    deadline = time.monotonic() + timeout
    alive = procs
    while time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in alive if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


T = TypeVar("T")


def wait_for(
    cond: Callable[[], T], timeout: float, what: str, detail: Callable[[], object] | None = None
) -> T:
    """Poll ``cond`` until it returns something true, and return that; fail naming ``what`` (and
    what ``detail`` says then) after ``timeout`` seconds. How a test waits: on a condition, never on
    a guess at a duration."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            said = f": {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{said}")
        time.sleep(0.02)


async def until(cond: Callable[[], T], limit_s: float, what: str) -> T:
    """``wait_for`` for a test on the event loop: polls ``cond`` between the loop's other work."""
    deadline = time.monotonic() + limit_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s:g} s waiting for {what}")
        await asyncio.sleep(0.01)


def pipe_bytes(fd: int) -> int:
    """Bytes written into the pipe ``fd`` reads from and not read yet (a pipe holds 64 KiB)."""
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, sys.byteorder)


def cpu_env() -> dict[str, str]:
    return dict(os.environ)


# Side by side (pytest-xdist, ``--dist loadgroup``, pyproject's addopts). The tests that start a
# Slurm cluster share one worker (munged, slurmctld and slurmd are heavy to start twice at once).
# Tests that launch MindSpore ranks run on two workers and hold rank slots while they run:
# ``@pytest.mark.mindspore(ranks=N)`` (N: the MindSpore processes that compute at once, 2 when
# unsaid), at most ``RANK_SLOTS`` at a time over all workers, so this 2-core machine never runs more
# than 4 ranks. Spares (standby or kept) and schedulers take no slot: a spare uses about a second
# of CPU to import MindSpore and join, as any process start does, then waits idle (0.05 % of a core,
# 400 MB) until it becomes a rank, which it does only once the rank it replaces is gone; a slot held
# for them stalled the other group (a 3-slot test beside a 2-slot one) for about 140 s of each
# group's 640 s beside two busy loops. First: xdist reads the group markers in its own hook of this
# name.
RANK_SLOTS = 4


# The MindSpore tests go in two groups (two workers), so no more than two workers ever wait for rank
# slots while the others run everything else. The modules are split between the groups so both end
# together, the catalogue's own halves counted (it splits itself: test_resume_catalogue._group). The
# figure beside each module: its tests' seconds on a fresh clone at 35782df and 082fbc2
# (bench/suite_timeline.py, bench/suite_split.py), less the slow twins since. A module not named
# here alternates.
_MINDSPORE_GROUP = {
    "tests/trainer/test_training.py": "a",  # 148
    "tests/e2e/test_user_resume.py": "a",  # 115
    "tests/e2e/test_standby.py": "a",  # 105
    "tests/e2e/test_hang_limits.py": "a",  # 63
    "tests/trainer/test_straggler_trainer.py": "a",  # 43
    "tests/trainer/test_resume_shapes.py": "a",  # 23
    "tests/tui/test_tui_terminal.py": "a",  # 12
    "tests/e2e/test_kept_standby.py": "b",  # 116
    "tests/e2e/test_ssh.py": "b",  # 57
    "tests/e2e/test_resume_check_nodes.py": "b",  # 55
    "tests/e2e/test_faults.py": "b",  # 46
    "tests/e2e/test_adhoc_hosts.py": "b",  # 45
    "tests/e2e/test_compile_cache_restart.py": "b",  # 43
    "tests/trainer/test_snapshot.py": "b",  # 39
    "tests/e2e/test_preflight.py": "b",  # 35
    "tests/e2e/test_operator_restart.py": "b",  # 34
    "tests/trainer/test_phases_trainer.py": "b",  # 26
    "tests/e2e/test_resume_summary.py": "b",  # 15
    "tests/trainer/test_resume_check_ms.py": "b",  # 16
    "tests/trainer/test_sharding.py": "b",  # 7
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    others: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if "slurm" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.get_closest_marker("mindspore") is not None:
            if item.get_closest_marker("xdist_group") is not None:
                continue  # a test that names its group keeps it (the resume catalogue's halves)
            group = _MINDSPORE_GROUP.get(module) or others.setdefault(module, "ab"[len(others) % 2])
            item.add_marker(pytest.mark.xdist_group(f"mindspore-{group}"))


@pytest.fixture(autouse=True)
def _rank_slots(request: pytest.FixtureRequest) -> Iterator[None]:
    mark = request.node.get_closest_marker("mindspore")
    if mark is None:
        yield
        return
    need = min(RANK_SLOTS, int(mark.kwargs.get("ranks", 2)))
    # For bench/suite_timeline.py, in the test's report: the one place that knows the slots.
    request.node.user_properties += [("rank_slots", need), ("rank_slot_limit", RANK_SLOTS)]
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
    if not run.isalnum():
        yield  # one worker: tests run one at a time anyway
        return
    folder = Path("/tmp") / f"mscon-test-slots-{run}"
    folder.mkdir(exist_ok=True)
    held: list[int] = []
    deadline = time.monotonic() + 1800
    # A turnstile: the test waiting for slots holds it, so tests that come later queue behind it
    # instead of taking the slots it waits for (a 4-rank test would wait for ever beside a worker
    # that keeps taking 2).
    gate = os.open(folder / "gate", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        # Slots are flock()ed files: a worker that dies releases its slots with its descriptors.
        while len(held) < need:
            for i in range(RANK_SLOTS):
                if len(held) == need:
                    break
                fd = os.open(folder / f"slot{i}", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append(fd)
                except OSError:
                    os.close(fd)
            if len(held) < need:
                for fd in held:  # all or none: two tests each holding half never wait on each other
                    os.close(fd)
                held.clear()
                assert time.monotonic() < deadline, f"no {need} MindSpore rank slots in 30 min"
                time.sleep(0.2)  # a poll for free slots, not a synchronisation
        os.close(gate)
        gate = -1
        yield
    finally:
        if gate >= 0:
            os.close(gate)
        for fd in held:
            os.close(fd)
