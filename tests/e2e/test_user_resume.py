"""Users' own scripts resume at their last step: the docs' ``net.py`` (a hand-written loop) and a
``Model.train`` LeNet, each with mscon_resume's lines, on 2 sshd nodes x 1 real MindSpore rank
(the resume agreed across nodes).

A rank is killed with SIGKILL in attempt 0 once it has passed step ``KILL_AT``; ``--max-restarts
1`` restarts the group. The next attempt's ranks must start right after the last step every rank
completed (at most one step lost), and every loss they print must equal the uninterrupted run's
at the same step, on every rank (same seed, same data). Also: the same script relaunched by hand
under plain ``msrun`` with ``MSCON_RESUME=1`` after a kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import (
    REPO,
    free_port,
    mscon,
    needs_mindspore,
    node_run_dir,
    run_process,
    run_processes,
    slow_twin,
    ssh_inventory,
    wait_for,
)
from mscon.agent import layout
from mscon.console.engine.plan import MINDSPORE_TIMERS
from second_user import intruder_uid, run_as
from sshd_nodes import SshdCluster

from mscon_resume import store

sys.path.insert(0, str(REPO / "bench"))
from fake_mnist import write_fake_mnist  # noqa: E402

SAMPLES_A_RANK = 96  # batch 32: 3 steps an epoch, 30 in net.py's 10 epochs
KILL_AT = 13  # past the snapshot interval's 5 timed steps, mid-epoch, with 5 epochs to go
MSRUN_EPOCH = 5  # steps an epoch of the plain msrun case (2 ranks): 50 in all
LOSS_LINE = re.compile(r"^epoch: ?(\d+),? step: ?(\d+), loss is (.+)$", re.M)


NODES = {"r0": "node1", "r1": "node2"}  # one rank a node: the resume agreed across nodes


def _job(tmp_path: Path, script: str, ranks: int) -> tuple[Path, Path]:
    """(workdir holding the example, the data folder)."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO / "examples" / script, work / script)
    return work, write_fake_mnist(tmp_path / "mnist", SAMPLES_A_RANK * ranks)


def _inventory(tmp_path: Path, cluster: SshdCluster, work: Path, data: Path, script: str, env: dict) -> Path:
    inv = ssh_inventory(tmp_path / "inv.yaml", cluster, 1, script, [], workdir=work)
    doc = yaml.safe_load(inv.read_text())
    doc["job"]["env"] = {"DATA_PATH": str(data), **env}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def _popen(tmp_path: Path, inv: Path, run_id: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mscon.console.cli", "run", "--no-tui", str(inv), "--run-id", run_id,
         "--json", str(tmp_path / f"{run_id}.json"), "--logs-dir", str(tmp_path / "runs"), *extra],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(rec.get("step"), int):
            out.append(rec["step"])
    return out


def _kill_r1_after(run_id: str, node: str, step: int, timeout: float = 240) -> None:
    """SIGKILL rank 1 once its metrics file says it completed ``step``. The process is found
    first: a scan of every process's environment takes steps' worth of time on a loaded machine."""
    metrics = Path(layout.metrics_path(node_run_dir(run_id, node), 0, "r1"))
    # attempt 0's r1, not a spare waiting for attempt 1
    victim = wait_for(lambda: run_process(run_id, 0, "r1"), timeout, "r1 to start")

    def reached() -> bool:
        assert victim.is_running(), "r1 ended before the kill"
        return max(_steps(metrics), default=0) >= step

    wait_for(reached, timeout, f"r1 to reach step {step}")
    victim.send_signal(signal.SIGKILL)


def _losses(run_dir: Path, nodes: dict[str, str], attempt: int) -> dict[str, dict[tuple[int, int], str]]:
    """Per rank: (epoch, step) -> the loss it printed in ``attempt``."""
    out = {}
    for name, node in nodes.items():
        text = Path(layout.log_path(run_dir / node, attempt, name)).read_text(errors="replace")
        out[name] = {(int(e), int(s)): loss.strip() for e, s, loss in LOSS_LINE.findall(text)}
    return out


def _resume_records(run_dir: Path, nodes: dict[str, str], attempt: int) -> dict[str, dict]:
    found = {}
    for name, node in nodes.items():
        for line in Path(layout.metrics_path(run_dir / node, attempt, name)).read_text().splitlines():
            rec = json.loads(line)
            if "resume" in rec:
                found[name] = rec["resume"]
    return found


def _plant(uid: int, folder: Path, ranks: int, tmp_path: Path) -> None:
    """What another user does first: the run's snapshot folder in /dev/shm, made before the run,
    open to all, with a snapshot of a late step for every rank (a well-formed file of nonsense)."""
    bait = tmp_path / "bait.msnap"
    import numpy as np

    from mscon_resume import snapfile

    with open(bait, "wb") as f:
        meta = {"step": 9999, "epoch": 0, "pos": 1, "saved_at": 0}
        snapfile.dump(f, {"fc.weight": np.zeros((10, 784), np.float32)}, meta, bytes(32))
    assert run_as(uid, "mkdir", "-m", "777", str(folder)).returncode == 0
    for rank in range(ranks):
        assert run_as(uid, "mkdir", "-m", "777", str(folder / f"rank_{rank}")).returncode == 0
        dest = str(folder / f"rank_{rank}" / f"snap_9999{snapfile.SUFFIX}")
        assert run_as(uid, "sh", "-c", 'cat > "$0"', dest, data=bait.read_bytes()).returncode == 0


def _check_resume(
    tmp_path: Path,
    cluster: SshdCluster,
    script: str,
    env: dict,
    intruder: bool = False,
    callback: bool = False,
) -> None:
    """``callback``: the script resumes by ``ResumeCallback``, which never resumes at an epoch's
    end (``mscon_resume/resumable.py``): the step before it is the one kept."""
    nodes = NODES
    work, data = _job(tmp_path, script, len(nodes))
    inv = _inventory(tmp_path, cluster, work, data, script, env)
    reference = f"resume-ref-{secrets.token_hex(3)}"
    done = mscon("run", "--no-tui", inv, "--run-id", reference, "--logs-dir", tmp_path / "runs", cwd=tmp_path)
    assert done.code == 0, done.err[-3000:]
    want = _losses(tmp_path / "runs" / reference, nodes, 0)

    run_id = f"resume-{secrets.token_hex(3)}"
    # The name another user can work out from the run's path (no key there yet: the plain digest).
    planted = Path(layout.shm_snapshot_folder(str(node_run_dir(run_id, "node1"))))
    uid = intruder_uid() if intruder else None
    if intruder and uid is None:
        pytest.skip("no second local user: useradd failed and there is no 'nobody'")
    if uid is not None:
        _plant(uid, planted, len(nodes), tmp_path)
    proc = _popen(tmp_path, inv, run_id, "--max-restarts", "1")
    try:
        _kill_r1_after(run_id, nodes["r1"], KILL_AT)
        if uid is not None:  # while the run is live: the ranks' real folder is none of its business
            # Named under the run's key (layout.shm_snapshot_folder reads it now): not the
            # planted name, nor one of its alternates.
            real = Path(layout.shm_snapshot_folder(str(node_run_dir(run_id, "node1"))))
            assert real != planted and not str(real).startswith(str(planted)), (real, planted)
            assert real.is_dir() and (real / "rank_0").is_dir()
            assert (real.stat().st_mode & 0o777) == 0o700 and real.stat().st_uid == os.getuid()
            for what in (real, real / "rank_0"):
                assert run_as(uid, "ls", str(what)).returncode != 0, what
            snaps = list(real.glob("rank_*/*/snap_*.msnap"))  # each stage (a loop, a callback) its own folder
            assert snaps, sorted(str(p) for p in real.rglob("*"))
            for snap in snaps:
                assert (snap.stat().st_mode & 0o777) == 0o600
                assert run_as(uid, "cat", str(snap)).returncode != 0, snap
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        if uid is not None:
            shutil.rmtree(planted, ignore_errors=True)
    assert proc.returncode == 0, err[-4000:]
    runs = tmp_path / "runs" / run_id
    # The last step every rank completed in attempt 0, from their metrics files.
    last_common = min(
        max(_steps(Path(layout.metrics_path(runs / node, 0, name))), default=0)
        for name, node in nodes.items()
    )
    assert last_common >= KILL_AT, last_common
    records = _resume_records(runs, nodes, 1)
    assert set(records) == set(nodes), records
    resumed = {r["step"] for r in records.values()}
    assert len(resumed) == 1 and {r["source"] for r in records.values()} == {"snapshot"}, records
    (step,) = resumed
    per_epoch = SAMPLES_A_RANK // 32
    resumable = [s for s in range(1, last_common + 1) if not (callback and s % per_epoch == 0)]
    # At most one step lost: the newest, when a rank was killed while writing its snapshot.
    assert step in resumable[-2:], (step, last_common)
    for name, node in nodes.items():
        first = min(_steps(Path(layout.metrics_path(runs / node, 1, name))))
        assert first == step + 1, (name, first, step)
    got = _losses(runs, nodes, 1)
    for name, lines in got.items():
        assert len(lines) >= 3, (name, lines)
        for key, loss in lines.items():
            assert want[name].get(key) == loss, (name, key, loss, want[name].get(key))
    if uid is not None:  # the planted folder was never in the ranks' way: no rank met it
        for name, node in nodes.items():
            log = Path(layout.log_path(runs / node, 0, name)).read_text(errors="replace")
            assert f"{planted}" not in log, name
    summary = json.loads((tmp_path / f"{run_id}.json").read_text())
    assert [a["outcome"] for a in summary["attempts"]] == ["failed", "succeeded"], summary["attempts"]
    assert run_processes(run_id) == []
    for node in cluster.nodes:  # the run's snapshots went with it: /dev/shm is memory
        run_dir = str(node_run_dir(run_id, node.name))
        assert layout.own_shm_snapshot_folders(run_dir) == [], node.name


@pytest.mark.ssh
@pytest.mark.mindspore(ranks=2)  # 2 nodes x 1
@needs_mindspore
def test_the_docs_net_py_resumes_at_its_last_step_with_the_same_losses(
    tmp_path: Path, sshd_cluster: SshdCluster
) -> None:
    """Also: another local user made the /dev/shm folder it can work out from the run's path
    first and planted a late snapshot for every rank; the ranks' folder is named under the run's
    key, so they never meet it, and during the run it can list and read none of their snapshots."""
    _check_resume(tmp_path, sshd_cluster, "net.py", {}, intruder=True)


@pytest.mark.ssh
@pytest.mark.mindspore(ranks=2)  # 2 nodes x 1
@needs_mindspore
def test_a_model_train_script_resumes_at_its_last_step_with_the_same_losses(
    tmp_path: Path, sshd_cluster: SshdCluster
) -> None:
    _check_resume(tmp_path, sshd_cluster, "lenet_model_train.py", {"EPOCHS": "8"}, callback=True)  # 24 steps


def test_examples_net_py_is_the_docs_sample_with_three_lines_changed() -> None:
    """The example is MindSpore's net.py plus mscon_resume's three marked lines: nothing else."""
    marked = [
        line
        for line in (REPO / "examples" / "net.py").read_text().splitlines()
        if line.endswith("# mscon_resume")
    ]
    assert len(marked) == 3, marked


# ------------------------------------------------------------------ plain msrun, relaunched by hand


def _msrun(work: Path, data: Path, log_dir: str, port: int, resume: bool) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "RANK_", "MSCON_"))}
    env.update(DATA_PATH=str(data), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    env.update(MINDSPORE_TIMERS)  # MindSpore's cluster timers at 1 s, as mscon sets them
    if resume:
        env["MSCON_RESUME"] = "1"
    return subprocess.Popen(
        ["msrun", "--worker_num=2", "--local_worker_num=2", f"--master_port={port}", "--join=True",
         f"--log_dir={log_dir}", "net.py"],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def _kill_everything_in(work: Path) -> None:
    """Every process running in ``work``: msrun, its workers (each in a session of its own) and
    the ``tail -f`` it keeps on their logs."""
    for p in psutil.process_iter(["cwd"]):
        if p.info["cwd"] == str(work) and p.pid != os.getpid():
            with contextlib.suppress(psutil.Error):
                p.kill()


def _worker_losses(log: Path) -> dict[tuple[int, int], str]:
    return {(int(e), int(s)): x.strip() for e, s, x in LOSS_LINE.findall(log.read_text(errors="replace"))}


def _snapshot_step(snapshots: Path) -> int:
    """The last step both ranks have a snapshot of: the step a relaunch resumes after (rank 0 can
    be a step behind rank 1 when the kill comes)."""
    return min(max(store.steps(str(snapshots), r, "loop0"), default=0) for r in (0, 1))  # net.py's one loop


def _killed_in_the_middle_then_relaunched(work: Path, data: Path, snapshots: Path) -> None:
    """msrun launches net.py, every process of it is killed once both ranks have a snapshot of the
    middle step in ``snapshots``, then msrun launches it again with ``MSCON_RESUME=1``."""
    first = _msrun(work, data, "first", free_port(), resume=False)
    try:
        middle = 5 * MSRUN_EPOCH
        wait_for(lambda: _snapshot_step(snapshots) >= middle, 240, "both ranks' snapshot of the middle step")
    finally:
        # Every process of the launch, as a lost node would: msrun's workers run in sessions of
        # their own, so they are found by what they run and where.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        _kill_everything_in(work)
        first.wait(timeout=30)
    relaunch = _msrun(work, data, "second", free_port(), resume=True)
    try:
        assert relaunch.wait(timeout=240) == 0
    finally:
        _kill_everything_in(work)  # msrun's `tail -f` of its logs, if it left one


@pytest.mark.mindspore  # 2 ranks
@needs_mindspore
@slow_twin(
    "a relaunch under plain msrun with MSCON_RESUME=1: the resume catalogue's dp2_hand_loop and "
    "dp2_model_train are killed and relaunched under msrun in the README's command"
)
def test_net_py_relaunched_under_plain_msrun_resumes_at_its_last_step(tmp_path: Path) -> None:
    if shutil.which("msrun", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("msrun is not beside this python")
    from conftest import free_port

    work, _ = _job(tmp_path, "net.py", 2)
    data = write_fake_mnist(tmp_path / "small", 64 * MSRUN_EPOCH)  # 2 ranks x 32 a step
    ref = _msrun(work, data, "ref", free_port(), resume=False)
    assert ref.wait(timeout=240) == 0
    want = [_worker_losses(work / "ref" / f"worker_{r}.log") for r in (0, 1)]

    # Another local user made the folder first, with a late snapshot for each rank: the two ranks
    # of this node both pass over it to the same alternate, and the relaunch trusts nothing in it.
    shm = Path(store.shm_folder(str(work / ".mscon-state")))
    uid = intruder_uid()
    if uid is not None:
        _plant(uid, shm, 2, tmp_path)
    snapshots = Path(f"{shm}.1") if uid is not None else shm
    try:
        _killed_in_the_middle_then_relaunched(work, data, snapshots)
    finally:
        if uid is not None:
            shutil.rmtree(shm, ignore_errors=True)
    if uid is not None:
        said = f"{shm} is not this user's private folder; snapshots go to {snapshots}"
        for r in (0, 1):
            assert (work / "first" / f"worker_{r}.log").read_text(errors="replace").count(said) == 1, r
    for r in (0, 1):
        log = (work / "second" / f"worker_{r}.log").read_text(errors="replace")
        m = re.search(r"mscon_resume: rank \d resumes after step (\d+)", log)
        assert m and int(m.group(1)) >= 5 * MSRUN_EPOCH, log[-2000:]
        got = _worker_losses(work / "second" / f"worker_{r}.log")
        assert got and all(want[r][k] == v for k, v in got.items()), (r, got)
        # nothing from the start again (net.py numbers its steps from 0 in each epoch)
        assert min(e * MSRUN_EPOCH + s for e, s in got) > int(m.group(1)) - MSRUN_EPOCH
    assert not snapshots.exists()  # a finished run drops its snapshots
