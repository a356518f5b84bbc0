"""The first minutes of a new user, end to end: mscon installed from a wheel of this checkout into a
fresh venv, a folder holding only ``train.py``, two sshd nodes known only as ``~/.ssh/config``
aliases whose host keys are only in the file the config names (``UserKnownHostsFile``), and no
inventory: ``mscon run --no-tui --hosts node-a,node-b --nproc-per-node 2 -- train.py`` trains.
``mscon init`` from the same install writes an inventory that validates."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, SSH_USER, Done, free_port, mindspore_missing
from sshd_nodes import SshdCluster, SshdNode, write_known_hosts
from test_ssh_known_hosts import CLIENT_ADDRESS, behind_bastion
from tmux_screen import keys, wait_for, wait_screen

USER_SCRIPT = Path(__file__).parent / "user_mindspore_script.py"
FLAG = "MSCON_E2E_FLAG"


@dataclass(frozen=True)
class Install:
    venv: Path
    site: Path  # the venv's site-packages, where the wheel went

    @property
    def mscon(self) -> Path:
        return self.venv / "bin" / "mscon"


def _check(cmd: list[str | Path], **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=240, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]} {done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """A wheel of the checkout in a fresh venv. The console's third-party dependencies come from the
    test environment through a folder of links that leaves mscon itself out, so ``mscon`` can only be
    the wheel's."""
    root = tmp_path_factory.mktemp("install")
    _check([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", REPO, "-w", root / "dist"])
    (wheel,) = (root / "dist").glob("mscon-*.whl")
    venv = root / "venv"
    _check([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    _check([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel])
    site = Path(_check([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    deps = root / "deps"
    deps.mkdir()
    ours = Path(sysconfig.get_path("purelib"))
    for entry in ours.iterdir():
        if not entry.name.startswith("mscon"):
            (deps / entry.name).symlink_to(entry)
    (site / "zz_test_deps.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    where = _check(
        [
            py,
            "-c",
            "import mscon.console.cli.main as m, mscon.agent as a; print(m.__file__); print(a.__file__)",
        ],
        cwd=root,
        env=_clean_env(root),
    )
    assert all(Path(p).is_relative_to(site) for p in where.stdout.split()), where.stdout
    return Install(venv, site)


def _clean_env(home: Path) -> dict[str, str]:
    """This process's environment without what points Python at the checkout, with HOME ``home``."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "HOME": str(home)}


def _mscon(install: Install, *args: str | Path, cwd: Path, home: Path, timeout: float = 240) -> Done:
    p = subprocess.run(
        [str(install.mscon), *map(str, args)],
        cwd=cwd,
        env=_clean_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Done(p.returncode, p.stdout, p.stderr)


def _ssh_home(tmp_path: Path, cluster: SshdCluster, config: str) -> Path:
    """An empty HOME but for ~/.ssh/config (``config``, then the identity and user for every host)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "site").mkdir()
    (home / ".ssh" / "config").write_text(
        config + f"Host *\n  User {SSH_USER}\n  IdentityFile {cluster.client_key}\n"
    )
    return home


def _aliases(nodes: list[SshdNode], extra: str = "") -> str:
    names = ("node-a", "node-b")
    pairs = zip(names, nodes, strict=True)
    return "".join(f"Host {alias}\n  HostName {n.host}\n  Port {n.port}\n{extra}" for alias, n in pairs)


@pytest.fixture
def home(tmp_path: Path, sshd_cluster: SshdCluster) -> Iterator[Path]:
    """node-a and node-b are aliases of the two sshd nodes, and their host keys are only in the file
    the config's UserKnownHostsFile names (no ~/.ssh/known_hosts)."""
    absent = tmp_path / "no-global-file"
    files = f"  UserKnownHostsFile ~/site/cluster_hosts\n  GlobalKnownHostsFile {absent}\n"
    home = _ssh_home(tmp_path, sshd_cluster, _aliases(sshd_cluster.nodes, files))
    write_known_hosts(home / "site" / "cluster_hosts", sshd_cluster.nodes)
    yield home


# For the tests of how nodes are reached (known-hosts files, a bastion), not of training: prints
# what the user's MindSpore script prints, without MindSpore (no rank slots held).
REACH_SCRIPT = (
    "for step in (1, 2):\n    print(f'epoch: 2 step: {step}, loss is 0.{step}', flush=True)\n"
    "print('user script done')\n"
)


def _trains_with_hosts(
    installed: Install, home: Path, tmp_path: Path, per_node: int, script: str | None = None
) -> Done:
    """``mscon run --no-tui --hosts node-a,node-b`` of a folder holding only train.py (the user's
    MindSpore script, or ``script``)."""
    work = tmp_path / "project"
    work.mkdir()
    script = (script or USER_SCRIPT.read_text()) + (
        f"\nimport os\nprint('{FLAG}=' + repr(os.environ.get('{FLAG}')))\n"
    )
    (work / "train.py").write_text(script)
    done = _mscon(
        installed, "run", "--no-tui", "--hosts", "node-a,node-b", "--nproc-per-node", str(per_node),
        "--python", sys.executable,  # the nodes' interpreter with MindSpore (the console's venv has none)
        "--env", f"{FLAG}=from the flag", "--master-port", str(free_port()), "--", "train.py",
        cwd=work, home=home, timeout=280,
    )  # fmt: skip
    assert done.code == 0, done.err[-4000:]
    for rank in range(2 * per_node):
        prefix = f"[{'node-a' if rank < per_node else 'node-b'} r{rank}]"
        # Trained: LossMonitor's lines of the last epoch, then the script's end; and the flag's value.
        last_epoch = rf"^{re.escape(prefix)} epoch: 2 step: \d+, loss is \d"
        assert re.search(last_epoch, done.out, re.M), done.out[-3000:]
        assert f"{prefix} user script done" in done.out, done.out[-3000:]
        assert f"{prefix} {FLAG}='from the flag'" in done.out, done.out[-3000:]
    assert not (home / ".ssh" / "known_hosts").exists()  # the keys were found, not learned
    return done


def _replay_in_a_terminal(install: Install, work: Path, home: Path, run_id: str) -> None:
    """``mscon replay RUN_ID`` of the same install, in a real terminal (tmux): the run's console
    comes back from its recording, and q leaves it."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is needed to replay in a real terminal (apt-get install -y tmux; .ci/run does)")
    session, marker = f"mscon-replay-{secrets.token_hex(3)}", work / "replay.exit"
    cmd = (
        f"cd {work} && env -u PYTHONPATH -u VIRTUAL_ENV HOME={home} TERM=xterm-256color "
        f"{install.mscon} replay {run_id} --speed 0; echo exit=$? > {marker}; sleep 60"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "45", cmd], check=True)
    try:
        wait_screen(session, lambda s: run_id in s and "Overview" in s, 60, "the replayed run")
        wait_screen(session, lambda s: "succeeded" in s, 60, "the run's end, replayed")
        keys(session, "q")
        wait_for(session, marker.exists, 30, "replay to exit")
        assert marker.read_text().strip() == "exit=0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


@pytest.mark.ssh
@pytest.mark.mindspore
@pytest.mark.skipif(mindspore_missing() is not None, reason=mindspore_missing() or "")
def test_hosts_without_an_inventory_trains_from_a_wheel_install(
    tmp_path: Path, installed: Install, home: Path
) -> None:
    done = _trains_with_hosts(installed, home, tmp_path, per_node=2)
    work = tmp_path / "project"
    # The same install lists the run (from ./mscon-runs: its recording and summary), and prunes:
    # the nodes' folders with --hosts (a dry run names this run), and the local copy with --local.
    found = re.search(r"^mscon: run (\S+): ", done.err, re.M)
    assert found, done.err[-2000:]
    run_id = found.group(1)
    listed = _mscon(installed, "ls", cwd=work, home=home, timeout=60)
    assert listed.code == 0 and run_id in listed.out and "succeeded" in listed.out, listed.err
    assert (work / "mscon-runs" / run_id / "events.jsonl.gz").is_file()
    assert not (work / "mscon-runs" / run_id / "node-a" / "checkpoints").exists()
    _replay_in_a_terminal(installed, work, home, run_id)
    dry = _mscon(
        installed, "prune", "--hosts", "node-a,node-b", "--python", sys.executable, "--keep", "0",
        "--dry-run", cwd=work, home=home, timeout=120,
    )  # fmt: skip
    assert dry.code == 0 and f"would remove {run_id}" in dry.out, (dry.out, dry.err)
    local = _mscon(installed, "prune", "--local", "--keep", "0", "--hosts", "node-a,node-b",
                   "--python", sys.executable, cwd=work, home=home, timeout=120)  # fmt: skip
    assert local.code == 0 and not (work / "mscon-runs" / run_id).exists(), (local.out, local.err)


@pytest.mark.ssh
def test_hosts_with_keys_only_in_a_global_known_hosts_file(
    tmp_path: Path, installed: Install, sshd_cluster: SshdCluster
) -> None:
    """As sites distribute host keys (/etc/ssh/ssh_known_hosts; a temp file named by
    GlobalKnownHostsFile here), with no user known-hosts file at all."""
    site = tmp_path / "site_known_hosts"
    write_known_hosts(site, sshd_cluster.nodes)
    files = f"  UserKnownHostsFile ~/site/none\n  GlobalKnownHostsFile {site}\n"
    home = _ssh_home(tmp_path, sshd_cluster, _aliases(sshd_cluster.nodes, files))
    _trains_with_hosts(installed, home, tmp_path, per_node=1, script=REACH_SCRIPT)
    assert not (home / "site" / "none").exists()


@pytest.mark.ssh
def test_hosts_behind_a_proxyjump_bastion(tmp_path: Path, installed: Install, cluster3: SshdCluster) -> None:
    """node-a and node-b accept the console only through the bastion (ProxyJump in the config);
    every key, the bastion's included, in the config's UserKnownHostsFile."""
    nodes, bastion = behind_bastion(cluster3)
    config = _aliases(nodes, "  ProxyJump bastion\n") + (
        f"Host bastion\n  HostName {bastion.host}\n  Port {bastion.port}\n"
        f"Host *\n  BindAddress {CLIENT_ADDRESS}\n  UserKnownHostsFile ~/site/cluster_hosts\n"
    )
    home = _ssh_home(tmp_path, cluster3, config)
    write_known_hosts(home / "site" / "cluster_hosts", [*nodes, bastion])
    _trains_with_hosts(installed, home, tmp_path, per_node=1, script=REACH_SCRIPT)
    for n in nodes:  # reached through the bastion only
        log = n.log.read_text()
        assert "Accepted publickey for root from 127.0.0.1" in log and CLIENT_ADDRESS not in log


def test_init_from_the_wheel_install_writes_an_inventory_that_validates(
    tmp_path: Path, installed: Install
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    made = _mscon(
        installed,
        "init",
        "--hosts",
        "node-a,node-b",
        "--nproc-per-node",
        "2",
        "--",
        "train.py",
        cwd=work,
        home=home,
    )
    assert made.code == 0 and "wrote mscon.yaml (2 node(s), 4 rank(s)" in made.out, made.err
    checked = _mscon(installed, "validate", "mscon.yaml", cwd=work, home=home)
    assert checked.code == 0 and "ok: mscon.yaml (2 nodes, 4 ranks)" in checked.out, checked.err
    again = _mscon(installed, "init", cwd=work, home=home)
    assert again.code == 2 and "already exists" in again.err

    # Without a script: never the installed package's folder (the workdir is the user's project,
    # copied to every node): one line asks for the script, and nothing is written.
    demo = _mscon(installed, "init", "demo.yaml", "--device-target", "GPU", cwd=work, home=home)
    assert demo.code == 2 and "give your script after --" in demo.err, demo.err
    assert len(demo.err.strip().splitlines()) == 1 and not (work / "demo.yaml").exists()
    # The shipped samples validate where pip put them.
    for sample in sorted((installed.site / "mscon" / "inventory").glob("*.yaml")):
        assert "shared/" not in sample.read_text(), sample
        done = _mscon(installed, "validate", sample, cwd=work, home=home)
        assert done.code == 0, done.err
