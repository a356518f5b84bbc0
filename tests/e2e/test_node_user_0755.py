"""Node files are private over SSH (issue 33): a real ``mscon run --no-tui`` on two sshd nodes whose
login is a fresh non-root user with a 0755 home (as on many clusters). While the run is live and
after it ended, a second local user lists and reads nothing of what mscon keeps under that user's
``~/.cache/mscon`` (the sync archive, the unpacked workdir, the deployed agent, the run's logs,
metrics, journal and checkpoints), and every folder there is 0700, every file 0600. A control file
left 0644 in the same home shows that the second user can read what it is allowed to."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import ssh_inventory
from mscon.agent import layout
from node_files import listing, loose
from second_user import intruder_uid, run_as
from sshd_nodes import SshdCluster

pytestmark = pytest.mark.ssh

# The job, stdlib only (the agent's rank library needs numpy, which the node user's python lacks):
# metrics JSON lines where the agent says (MSCON_METRICS, as bench/fake_rank.py), a checkpoint as
# a trainer writes one (under the umask), then it waits for the test's word (a file "go" in the
# node's unpacked workdir) so the checks run while the run is live.
JOB = """\
import os, sys, time
if os.environ.get("MS_ROLE") == "MS_SCHED":
    print("scheduler: nothing to coordinate", flush=True)
    sys.exit(0)
metrics = open(os.environ["MSCON_METRICS"], "a")
rank = os.environ.get("RANK_ID", "0")
folder = os.path.join(os.environ["MSCON_STATE_DIR"], "rank_" + rank)
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "step_3.ckpt"), "w") as f:
    f.write("the weights")
for step in range(1, 4):
    metrics.write('{"step": %d, "loss": %f}\\n' % (step, 1.0 / step))
    metrics.flush()
    print("epoch: 1 step: %d, loss is %.6f" % (step, 1.0 / step), flush=True)
print("live", flush=True)
deadline = time.time() + 90
while not os.path.exists("go") and time.time() < deadline:
    time.sleep(0.05)
print("done", flush=True)
"""
SECRET = "distinctive-workdir-secret.txt"
# The console's own python may live under /root (0700): the node user gets the first it can run.
PYTHONS = (sys.executable, "/usr/bin/python3")


@pytest.fixture
def node_user(sshd_cluster: SshdCluster) -> Iterator[str]:
    """A fresh non-root login on every sshd node, its home 0755 with a ``~/.cache`` 0755 (so only
    mscon's own modes keep others out), authorized for the cluster's client key; removed after."""
    for tool in ("useradd", "userdel", "usermod", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: cannot make a non-root node user")
    name = f"msconu{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        # sshd (UsePAM no) refuses a locked account ("!" password) even for key logins.
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        pw = pwd.getpwnam(name)
        home = Path(pw.pw_dir)
        home.chmod(0o755)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        keys = ssh_dir / "authorized_keys"
        keys.write_text(sshd_cluster.client_key.with_name("client_key.pub").read_text())
        keys.chmod(0o600)
        cache = home / ".cache"
        cache.mkdir(mode=0o755, exist_ok=True)
        cache.chmod(0o755)
        for p in (ssh_dir, keys, cache):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        # The cluster's authorized_keys lies in root's pytest folder; let sshd read the user's too.
        for node in sshd_cluster.nodes:
            config = node.config.read_text().replace(
                f"AuthorizedKeysFile {sshd_cluster.authorized_keys}",
                f"AuthorizedKeysFile {sshd_cluster.authorized_keys} .ssh/authorized_keys",
            )
            node.config.write_text(config)
            sshd_cluster.restart_node(node)
        yield name
    finally:
        subprocess.run(["userdel", "-r", "-f", name], capture_output=True, check=False)


def _python_for(user: str) -> str:
    """The first of PYTHONS that ``user`` can run (3.8 or later: the agent's floor); skip if none."""
    tried = []
    for py in PYTHONS:
        got = subprocess.run(
            ["runuser", "-u", user, "--", py, "-c", "import sys; assert sys.version_info >= (3, 8)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if got.returncode == 0:
            return py
        why = got.stderr.strip().splitlines() or [f"exit {got.returncode}"]
        tried.append(f"{py}: {why[-1]}")
    pytest.skip(f"no python 3.8+ the node user {user} can run: " + "; ".join(tried))


def _seen_by(uid: int, cache: Path) -> list[str]:
    """What the second user could read or list of everything under ``cache`` (nothing, when all is
    well): ``cat`` each file, ``ls`` each folder, ``cache`` itself included."""
    seen = []
    for folder, _subdirs, files in os.walk(cache):
        got = run_as(uid, "ls", "-a", folder)
        if got.returncode == 0 or got.stdout:
            seen.append(f"ls {folder}: {got.stdout[:80]!r}")
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            got = run_as(uid, "cat", path)
            if got.returncode == 0 or got.stdout:
                seen.append(f"cat {path}: {got.stdout[:80]!r}")
    return seen


def _check(uid: int, home: Path, run_id: str, nodes: list[str], when: str) -> None:
    cache = Path(layout.cache_folder(str(home)))
    run_dirs = [Path(layout.run_folder(str(cache), run_id, n)) for n in nodes]
    # What the checks below must cover is there (else "nothing was read" would mean nothing).
    must = [*cache.glob(f"{layout.SYNC_DIR}/*"), *cache.glob(f"{layout.AGENT_PREFIX}*/mscon_agent/main.py")]
    assert must, f"{when}: no sync archive or deployed agent under {cache}:\n{listing(cache)}"
    for run_dir in run_dirs:
        logs = list(Path(layout.attempt_folder(run_dir, 0)).glob("*"))
        ckpts = list(Path(layout.checkpoint_folder(str(run_dir))).glob("rank_*/step_3.ckpt"))
        secret = Path(layout.work_folder(str(run_dir))) / SECRET
        lacks = f"{when}: {run_dir} lacks logs, checkpoints or the workdir:\n{listing(cache)}"
        assert logs and ckpts and secret.is_file(), lacks
        assert Path(layout.journal_file(str(run_dir))).is_file(), f"{when}: no journal in {run_dir}"
        must += [*logs, *ckpts, secret]
    bad = loose(cache)
    assert not bad, f"{when}: not private (want folders 0700, files 0600):\n" + "\n".join(bad)
    seen = _seen_by(uid, cache)
    for path in must:  # named again, by full path: a cat that fails only on the walk's order is caught
        got = run_as(uid, "cat", str(path))
        if got.returncode == 0 or got.stdout:
            seen.append(f"cat {path}: {got.stdout[:80]!r}")
    assert not seen, f"{when}: another user read:\n" + "\n".join(seen) + "\n" + listing(cache)


def test_a_second_user_reads_nothing_of_a_run_in_a_0755_home(
    tmp_path: Path, sshd_cluster: SshdCluster, node_user: str
) -> None:
    uid = intruder_uid()
    if uid is None:
        pytest.skip("no second local user (useradd failed and there is no nobody)")
    python = _python_for(node_user)
    home = Path(pwd.getpwnam(node_user).pw_dir)
    assert uid not in (0, pwd.getpwnam(node_user).pw_uid), "the second user must be another, unprivileged one"
    # The control: what the home holds open to all, the second user does read (a run_as that ran
    # nothing, or could read nothing at all, fails here rather than passing the checks below).
    control = home / "control.txt"
    control.write_text("open to all\n")
    control.chmod(0o644)
    got = run_as(uid, "cat", str(control))
    assert got.returncode == 0 and got.stdout == b"open to all\n", got
    assert run_as(uid, "ls", str(home / ".cache")).returncode == 0  # ~/.cache (0755) is reachable

    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    (work / SECRET).write_text("only the node user may read this\n")
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 1, "job.py", [], workdir=work)
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"].update(user=node_user, python=python)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    nodes = [n.name for n in sshd_cluster.nodes]
    run_id = f"u0755-{secrets.token_hex(3)}"
    argv = [sys.executable, "-m", "mscon.console.cli", "run", "--no-tui", str(inv), "--run-id", run_id]
    argv += ["--logs-dir", str(tmp_path / "runs")]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        live = set()
        for line in proc.stdout:
            if line.rstrip().endswith("] live"):
                live.add(line.split("]")[0])
                if len(live) == len(nodes):
                    break
        else:
            pytest.fail(f"the run ended before its ranks were live: {proc.stderr.read()[-3000:]}")
        _check(uid, home, run_id, nodes, "while the run is live")
        cache = layout.cache_folder(str(home))
        for n in nodes:  # the jobs' word to finish, in each node's unpacked workdir
            (Path(layout.work_folder(layout.run_folder(cache, run_id, n))) / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    for n in nodes:  # the go files were root's; the checks after the run are of mscon's files
        Path(layout.work_folder(layout.run_folder(cache, run_id, n)), "go").unlink(missing_ok=True)
    _check(uid, home, run_id, nodes, "after the run")
