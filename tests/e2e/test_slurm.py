"""End to end inside a real Slurm allocation (munged + slurmctld + slurmd started by the fixture).

The allocation is a real one (``salloc --no-shell``); mscon runs with the variables Slurm gives a
job step (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURM_NTASKS_PER_NODE``), so after it ends
the allocation is still there and ``squeue -s`` can show that no step of mscon's was left. Most
tests use one node (this machine's hostname); the two-node tests add a slurmd in network and UTS
namespaces of its own (tests/slurm_cluster.py).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import (
    REPO,
    free_port,
    mscon,
    mscon_popen,
    needs_mindspore,
    run_processes,
    wait_for,
    wait_gone,
    write_inventory,
)
from mscon.agent import layout
from mscon.console.transport.slurm_dial import DIAL_BOOT
from mscon.console.transport.slurm_launcher import ENV_CONSOLE_ADDRESS
from slurm_cluster import (
    SlurmCluster,
    SlurmError,
    netns_unavailable_reason,
    slurm_unavailable_reason,
    start_slurm_cluster,
)

FAKE = "bench/fake_rank.py"
TRAIN = "trainer/train.py"
VENV_PYTHON = sys.executable


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        cluster = start_slurm_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmError as exc:
        pytest.skip(f"the Slurm test cluster did not start here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


class Alloc:
    def __init__(self, cluster: SlurmCluster, job_id: str, tasks_per_node: int) -> None:
        self.cluster, self.job_id = cluster, job_id
        nodelist = cluster.run("squeue", "-h", "-j", job_id, "-o", "%N").stdout.strip()
        self.env = cluster.env(
            SLURM_JOB_ID=job_id,
            SLURM_JOB_NODELIST=nodelist,
            SLURM_NTASKS_PER_NODE=str(tasks_per_node),
        )

    def our_steps(self) -> list[str]:
        """mscon's steps in this allocation, as squeue -s and scontrol show step list them."""
        listed = [s for s in self.cluster.steps() if s.startswith(f"{self.job_id}.") and " mscon-" in s]
        r = self.cluster.run("scontrol", "-o", "show", "step", self.job_id)
        shown = re.findall(r"StepId=(\S+) .* Name=(mscon-\S+)", r.stdout)
        assert r.returncode == 0 or "not found" in r.stderr + r.stdout, r.stderr
        return sorted(set(listed) | {f"{step} {name}" for step, name in shown})


@pytest.fixture
def alloc(slurm: SlurmCluster) -> Iterator[Alloc]:
    r = slurm.run("salloc", "-N1", "--ntasks-per-node=2", "--no-shell", timeout=60)
    m = re.search(r"Granted job allocation (\d+)", r.stderr)
    assert m, f"salloc failed: {r.stderr}"
    a = Alloc(slurm, m.group(1), 2)
    try:
        yield a
    finally:
        slurm.run("scancel", a.job_id)


def _inventory(path: Path, script: str, args: list[str], **extra: object) -> Path:
    return write_inventory(
        path,
        {
            "name": "slurm-test",
            "device_target": "CPU",
            "defaults": {"python": VENV_PYTHON, "env": {"GLOG_v": "3"}},
            "nodes": {"from": "slurm", **extra},
            "scheduler": {"port": free_port()},
            "job": {"workdir": str(REPO), "script": script, "args": args},
            "stop": {"grace_s": 2},
        },
    )


def _wait_for_line(proc: subprocess.Popen[str], *needles: str, timeout: float = 180) -> None:
    """Read the console's output until every needle has been in a line, in any order (two ranks'
    lines interleave: a second wait would miss a line the first one read past)."""
    seen: list[str] = []
    missing = set(needles)
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        missing -= {n for n in missing if n in line}
        if not missing:
            return
        assert time.monotonic() < deadline, f"{sorted(missing)} not seen in time; last lines: {seen[-20:]}"
    raise AssertionError(
        f"output ended before {sorted(missing)}; stderr: {proc.stderr.read()[-3000:] if proc.stderr else ''}"
    )


def _wait_no_step(alloc: Alloc, timeout: float) -> list[str]:
    try:
        wait_for(lambda: not alloc.our_steps(), timeout, "no step of ours left")
    except AssertionError:
        return alloc.our_steps()
    return []


# srun, first on the console's PATH, that keeps a copy of the line the console writes on its stdin
# (the step's key and the run's TLS material: what someone able to read that pipe would hold), then
# runs the real srun with that line as its stdin.
_CAPTURING_SRUN = """#!/bin/sh
line="$MSCON_TEST_STDIN_DIR/$(date +%s%N)-$$"
cat > "$line"
exec {real} "$@" < "$line"
"""


def capturing_srun(folder: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with a stand-in srun first on its PATH that keeps each step's stdin line in ``folder``
    (read them with :func:`boot_lines`)."""
    real = shutil.which("srun", path=env.get("PATH"))
    assert real is not None
    (folder / "bin").mkdir(parents=True)
    (folder / "lines").mkdir(mode=0o700)
    srun = folder / "bin" / "srun"
    srun.write_text(_CAPTURING_SRUN.format(real=real))
    srun.chmod(0o700)
    return {**env, "PATH": f"{folder / 'bin'}:{env['PATH']}", "MSCON_TEST_STDIN_DIR": str(folder / "lines")}


def boot_lines(folder: Path) -> list[tuple[str, str, str, str]]:
    """Each step's line as the console wrote it (address, the step's key, the run's certificate and
    TLS key, the last two as hex), oldest step first."""
    found = []
    for path in sorted((folder / "lines").iterdir()):
        words = path.read_text().split()
        assert len(words) == 4, (path, path.read_text()[:200])
        found.append((words[0], words[1], words[2], words[3]))
    return found


def no_dial_value_in_any_environment(values: tuple[str, ...]) -> int:
    """No process of this machine (srun, slurmstepd, the dial, the agent, the ranks, the console)
    holds any of ``values`` in its environment, nor a variable of the dial but the python's name.
    The number of processes read."""
    read = 0
    for p in psutil.process_iter():
        try:
            raw = Path(f"/proc/{p.pid}/environ").read_bytes()
        except OSError:
            continue
        read += 1
        names = [v.split(b"=", 1)[0] for v in raw.split(b"\0")]
        assert not [n for n in names if n.startswith(b"MSCON_DIAL") and n != b"MSCON_DIAL_PYTHON"], (p, names)
        for value in values:
            assert value.encode() not in raw, (p, " ".join(p.cmdline())[:200])
    return read


def _srun_of(proc: subprocess.Popen[str]) -> psutil.Process:
    def srun() -> psutil.Process | None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.name() == "srun":
                    return child
            except psutil.Error:
                continue
        return None

    return wait_for(srun, 30, "mscon's srun")


# ------------------------------------------------------------------ no MindSpore


def test_nodes_and_devices_come_from_the_allocation(tmp_path: Path, alloc: Alloc) -> None:
    """Ranks per node from SLURM_NTASKS_PER_NODE, the node from the node list; the logs come back
    over the dial channel; the step is gone when mscon exits (the allocation is not)."""
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "15", "--rate", "50"])
    t0 = time.monotonic()
    done = mscon(
        "run", "--no-tui", inv, "--json", tmp_path / "s.json", cwd=tmp_path, env=alloc.env, timeout=120
    )
    took = time.monotonic() - t0
    assert done.code == 0, done.err[-3000:]
    node = alloc.cluster.node
    s = json.loads((tmp_path / "s.json").read_text())
    workers = sorted((r["node"], r["rank"], r["last_step"]) for r in s["ranks"] if r["rank"] >= 0)
    assert workers == [(node, 0, 15), (node, 1, 15)]
    logs = Path(s["logs_dir"])
    assert "training finished" in Path(layout.log_path(logs / node, 0, "r1")).read_text()
    assert Path(layout.log_path(logs / node, 0, "sched")).is_file()
    assert not (logs / node / layout.WORK_DIR).exists()  # the synced workdir is not fetched
    assert alloc.our_steps() == []
    assert alloc.cluster.jobs() and any(j.startswith(alloc.job_id + " ") for j in alloc.cluster.jobs())
    print(f"2 fake ranks through srun: {took:.2f} s, mscon run end to end")


def test_inventory_devices_win_and_check_runs(tmp_path: Path, alloc: Alloc) -> None:
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "3"], devices=1)
    done = mscon(
        "run", "--no-tui", "--no-check", inv, "--json", tmp_path / "s.json", cwd=tmp_path, env=alloc.env
    )
    assert done.code == 0, done.err[-3000:]
    ranks = [r["rank"] for r in json.loads((tmp_path / "s.json").read_text())["ranks"] if r["rank"] >= 0]
    assert ranks == [0]
    # --slurm on an inventory that lists nodes: the allocation's node replaces them.
    listed = write_inventory(
        tmp_path / "listed.yaml",
        {
            "name": "listed",
            "device_target": "CPU",
            "defaults": {"python": VENV_PYTHON},
            "nodes": [{"host": "elsewhere.invalid", "name": "x", "devices": 2}],
            "scheduler": {"port": free_port()},
            "job": {"workdir": str(REPO), "script": FAKE, "args": ["--steps", "2"]},
        },
    )
    done = mscon(
        "check", "--slurm", "--quick", listed, "--json", tmp_path / "c.json", cwd=tmp_path, env=alloc.env
    )
    assert done.code in (0, 3), done.err[-3000:]
    assert alloc.cluster.node in done.out and "elsewhere" not in done.out + done.err
    assert alloc.our_steps() == []


def test_secret_and_inventory_values_stay_off_command_lines(tmp_path: Path, alloc: Alloc) -> None:
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "100000", "--rate", "20"])
    run_id = f"sec-{secrets.token_hex(3)}"
    env = capturing_srun(tmp_path / "capture", alloc.env)
    proc = mscon_popen("run", "--no-tui", "--no-check", inv, "--run-id", run_id, cwd=tmp_path, env=env)
    try:
        _wait_for_line(proc, "r1] epoch: 1 step: 3,")
        srun = _srun_of(proc)
        ((_, key, _, _),) = boot_lines(tmp_path / "capture")
        assert len(key) == 64
        srun_argv = " ".join(srun.cmdline())
        for value in (VENV_PYTHON, "slurm-test", str(inv), key, alloc.cluster.node):
            assert value not in srun_argv, value
        for p in psutil.process_iter(["cmdline"]):
            assert key not in " ".join(p.info["cmdline"] or []), p
        ranks = run_processes(run_id)
        assert len(ranks) >= 2  # 2 ranks (a fake scheduler may have ended)
        for r in ranks:
            env = r.environ()
            assert not any(k.startswith("MSCON_DIAL") for k in env), sorted(env)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert _wait_no_step(alloc, 10) == []


def _dials(alloc: Alloc, node: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if (p.info["cmdline"] or [])[-2:] == ["-c", DIAL_BOOT]:
                env = p.environ()
                if env.get("SLURM_JOB_ID") == alloc.job_id and env.get("SLURMD_NODENAME") == node:
                    found.append(p)
        except psutil.Error:
            continue
    return found


def lose_a_node(tmp_path: Path, alloc: Alloc, node: str) -> None:
    """The node's dial killed: its agent and ranks die with it, the node is lost, and the restart
    reaches it through a new step of its own; at the end no step is left."""
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "60", "--rate", "20"])
    proc = mscon_popen(
        "run", "--no-tui", "--no-check", inv, "--max-restarts", "1", "--json", tmp_path / "s.json",
        cwd=tmp_path, env=alloc.env,
    )  # fmt: skip
    try:
        _wait_for_line(proc, f"[{node} r", "r0] epoch: 1 step: 3,")
        steps, dials = alloc.our_steps(), _dials(alloc, node)
        assert len(dials) == 1 and len(steps) == 1, (dials, steps)
        dials[0].kill()
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert [a["outcome"] for a in s["attempts"]] == ["failed", "succeeded"], s["attempts"]
    assert s["attempts"][0]["reason"].startswith(f"lost the node {node}:")
    assert _wait_no_step(alloc, 10) == []


def test_a_lost_node_comes_back_in_a_step_of_its_own(tmp_path: Path, alloc: Alloc) -> None:
    lose_a_node(tmp_path, alloc, alloc.cluster.node)


def test_killed_console_ends_the_step_and_its_ranks(tmp_path: Path, alloc: Alloc) -> None:
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "100000", "--rate", "20"])
    run_id = f"kill-{secrets.token_hex(3)}"
    proc = mscon_popen("run", "--no-tui", "--no-check", inv, "--run-id", run_id, cwd=tmp_path, env=alloc.env)
    try:
        _wait_for_line(proc, "r1] epoch: 1 step: 3,")
        ranks = run_processes(run_id)
        assert len(ranks) >= 2 and len(alloc.our_steps()) == 1
    finally:
        proc.kill()  # no cleanup of its own: the nodes see the connections close
        proc.communicate(timeout=30)
    t0 = time.monotonic()
    assert wait_gone(ranks, 15) == []
    assert _wait_no_step(alloc, 15) == [], alloc.our_steps()
    print(f"ranks and step gone {time.monotonic() - t0:.2f} s after kill -9 of the console")


@pytest.mark.parametrize(
    ("variables", "needle"),
    [
        ({}, "no Slurm allocation: SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "12x"}, "not a Slurm job id"),
        (
            {"SLURM_JOB_ID": "999999", "SLURM_JOB_NODELIST": "vm"},
            "Slurm job 999999 (SLURM_JOB_ID) is not known",
        ),
        ({"SLURM_JOB_NODELIST": "node[5-1]"}, "scontrol show hostnames failed"),
        ({"SLURM_JOB_NODELIST": "node[1-"}, "'node]' is not usable as a host"),
        ({"SLURM_JOB_NODELIST": "-x;rm"}, "not a Slurm node list"),
        ({"SLURM_NTASKS_PER_NODE": None}, "cannot tell how many ranks to start per node"),
        ({"SLURM_NTASKS_PER_NODE": "eight"}, "SLURM_NTASKS_PER_NODE='eight'"),
    ],
)
def test_bad_or_missing_allocation_is_one_line_exit_2(
    tmp_path: Path, alloc: Alloc, variables: dict[str, str | None], needle: str
) -> None:
    env = dict(alloc.env)
    if not variables:
        env = alloc.cluster.env()  # no SLURM_* at all
    for k, v in variables.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "2"])
    argvs: list[tuple[str | Path, ...]] = [("run", "--no-tui", inv), ("check", "--quick", inv)]
    if "SLURM_NTASKS_PER_NODE" not in variables:  # the embedded inventory's 2 devices would do
        argvs.append(("run", "--no-tui", "--slurm"))
    for argv in argvs:
        done = mscon(*argv, cwd=tmp_path, env=env, timeout=60)
        assert done.code == 2, (argv, done.err)
        lines = done.err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (argv, done.err)
        assert "Traceback" not in done.err
    assert alloc.our_steps() == []


def test_sbatch_example_leaves_summary_and_logs_in_the_job_folder(
    tmp_path: Path, slurm: SlurmCluster
) -> None:
    """inventory/slurm-job.sbatch as shipped, with the inventory and the mscon on PATH swapped in."""
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "12", "--rate", "50"])
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # `mscon` is this venv's
    sbatch = REPO / "inventory" / "slurm-job.sbatch"
    (tmp_path / "elsewhere").mkdir()  # submitted from one folder, --chdir names the job's folder
    r = slurm.run(
        "sbatch", "--wait", "--nodes=1", "--ntasks-per-node=2", f"--chdir={tmp_path}", str(sbatch),
        timeout=180, cwd=tmp_path / "elsewhere", MSCON_INVENTORY=str(inv), PATH=path,
    )  # fmt: skip
    m = re.search(r"Submitted batch job (\d+)", r.stdout)
    assert r.returncode == 0 and m, (r.stdout, r.stderr, *(p.read_text() for p in tmp_path.glob("*.out")))
    job = m.group(1)
    folder = tmp_path / layout.LOGS_DIR / f"slurm-{job}"
    s = json.loads((folder / "summary.json").read_text())
    assert s["status"] == "succeeded" and s["run_id"] == f"slurm-{job}"
    assert Path(layout.log_path(folder / slurm.node, 0, "r1")).read_text().count("loss is") == 12
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert f"[{slurm.node} r0] epoch: 1 step: 12," in out


# ------------------------------------------------------------------ real MindSpore


@pytest.mark.mindspore
@needs_mindspore
def test_allocation_of_two_ranks_trains_the_real_trainer(tmp_path: Path, alloc: Alloc) -> None:
    args = ["--parallel-mode", "data_parallel", "--epochs", "2", "--steps-per-epoch", "10"]
    inv = _inventory(tmp_path / "inv.yaml", TRAIN, args)
    t0 = time.monotonic()
    done = mscon(
        "run", "--no-tui", inv, "--json", tmp_path / "s.json", cwd=tmp_path, env=alloc.env, timeout=300
    )
    took = time.monotonic() - t0
    assert done.code == 0, done.err[-4000:]
    node = alloc.cluster.node
    s = json.loads((tmp_path / "s.json").read_text())
    for rank in (0, 1):
        losses = re.findall(rf"^\[{node} r{rank}\] epoch: \d+ step: \d+, loss is ([0-9.]+)$", done.out, re.M)
        assert len(losses) == 20, (rank, losses)
        r = next(r for r in s["ranks"] if r["rank"] == rank)
        assert r["status"] == "ok" and r["last_step"] == 20
        assert r["last_loss"] < float(losses[0])  # it learns
    logs = layout.attempt_folder(Path(s["logs_dir"]) / node, 0)
    assert "training finished" in Path(layout.log_file(logs, "r0")).read_text()
    # One record a step (besides the phase and resume records, which hold no step of their own)
    records = Path(layout.metrics_file(logs, "r1")).read_text().splitlines()
    assert sum(line.startswith('{"step"') for line in records) == 20
    assert alloc.our_steps() == []
    print(f"2 MindSpore ranks through srun: {took:.1f} s, mscon run end to end")


@pytest.mark.mindspore
@needs_mindspore
def test_killed_rank_stops_the_job_and_leaves_no_step(tmp_path: Path, alloc: Alloc) -> None:
    args = [
        "--parallel-mode",
        "data_parallel",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "100000",
        "--step-sleep",
        "0.05",
    ]
    inv = _inventory(tmp_path / "inv.yaml", TRAIN, args)
    run_id = f"kill9-{secrets.token_hex(3)}"
    proc = mscon_popen(
        "run", "--no-tui", inv, "--run-id", run_id, "--json", tmp_path / "s.json", cwd=tmp_path, env=alloc.env
    )
    try:
        _wait_for_line(proc, "r1] epoch: 1 step: 5,")
        procs = run_processes(run_id)
        victim = [p for p in procs if p.environ()["MSCON_METRICS"].endswith("/r1" + layout.METRICS_SUFFIX)]
        assert len(procs) == 3 and len(victim) == 1
        others = [p for p in procs if p.pid != victim[0].pid]
        victim[0].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        survivors = wait_gone(others, 5.0)
        took = time.monotonic() - t0
        assert survivors == [], f"still running {took:.1f} s after the kill: {survivors}"
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 137, err[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["root_cause"]["name"] == "r1" and s["root_cause"]["signal"] == "SIGKILL"
    assert "step: 5," in Path(layout.log_path(Path(s["logs_dir"]) / alloc.cluster.node, 0, "r1")).read_text()
    assert alloc.our_steps() == []
    print(f"other ranks gone {took:.2f} s after kill -9 of r1")


@pytest.mark.mindspore
@needs_mindspore
def test_full_check_with_the_allreduce(tmp_path: Path, alloc: Alloc) -> None:
    """mscon check --slurm: every check, then the AllReduce smoke test, whose own session starts a
    second srun step next to the first; neither is left."""
    inv = _inventory(tmp_path / "inv.yaml", TRAIN, [])
    done = mscon(
        "check", "--slurm", inv, "--json", tmp_path / "c.json", cwd=tmp_path, env=alloc.env, timeout=300
    )
    assert done.code == 0, done.out + done.err[-3000:]
    across = {
        r["name"]: r for r in json.loads((tmp_path / "c.json").read_text())["results"] if r["node"] == "*"
    }
    assert across["collective"]["status"] == "ok", across["collective"]
    assert "AllReduce on 2 ranks: sum 3 ok" in across["collective"]["value"]
    assert alloc.our_steps() == []


# ------------------------------------------------------------------ two nodes


@pytest.fixture(scope="module")
def slurm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Two nodes: this machine and a slurmd in network and UTS namespaces of its own."""
    reason = slurm_unavailable_reason() or netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        cluster = start_slurm_cluster(tmp_path_factory.mktemp("slurm2"), netns_nodes=1)
    except SlurmError as exc:
        pytest.skip(f"the two-node Slurm test cluster did not start here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def alloc2(slurm2: SlurmCluster) -> Iterator[Alloc]:
    r = slurm2.run("salloc", "-N2", "--ntasks-per-node=1", "--no-shell", timeout=60)
    m = re.search(r"Granted job allocation (\d+)", r.stderr)
    assert m, f"salloc failed: {r.stderr}"
    a = Alloc(slurm2, m.group(1), 1)
    assert slurm2.console_address is not None
    # The namespaced node cannot reach this machine's loopback, where its hostname resolves.
    a.env[ENV_CONSOLE_ADDRESS] = slurm2.console_address
    try:
        yield a
    finally:
        slurm2.run("scancel", a.job_id)


def _two_node_run(tmp_path: Path, alloc2: Alloc, script: str, args: list[str]) -> tuple[dict, str]:
    inv = _inventory(tmp_path / "inv.yaml", script, args)
    done = mscon(
        "run", "--no-tui", inv, "--json", tmp_path / "s.json", cwd=tmp_path, env=alloc2.env, timeout=300
    )
    assert done.code == 0, done.err[-4000:]
    s = json.loads((tmp_path / "s.json").read_text())
    nodes = alloc2.cluster.nodes
    workers = sorted((r["node"], r["rank"], r["status"]) for r in s["ranks"] if r["rank"] >= 0)
    assert workers == [(nodes[0], 0, "ok"), (nodes[1], 1, "ok")]
    for node in nodes:  # each node's logs came back over its own channel
        assert Path(layout.log_path(Path(s["logs_dir"]) / node, 0, f"r{nodes.index(node)}")).is_file()
    assert alloc2.our_steps() == []
    return s, done.out


def test_two_nodes_in_namespaces_with_fake_ranks(tmp_path: Path, alloc2: Alloc) -> None:
    s, out = _two_node_run(tmp_path, alloc2, FAKE, ["--steps", "10", "--rate", "50"])
    assert f"[{alloc2.cluster.nodes[1]} r1] epoch: 1 step: 10," in out
    # Preflight across the two: the TCP mesh between the agents uses the addresses they dialled from.
    inv = tmp_path / "inv.yaml"
    done = mscon(
        "check", "--quick", inv, "--json", tmp_path / "c.json", cwd=tmp_path, env=alloc2.env, timeout=120
    )
    assert done.code == 0, done.out + done.err[-2000:]
    across = {
        r["name"]: r for r in json.loads((tmp_path / "c.json").read_text())["results"] if r["node"] == "*"
    }
    assert across["mesh"]["status"] == "ok" and across["mesh"]["value"].startswith("2 x 2 connected")
    assert across["sched"]["status"] == "ok" and across["sched"]["value"].startswith(
        alloc2.env[ENV_CONSOLE_ADDRESS]
    )
    assert alloc2.our_steps() == []


@pytest.mark.mindspore
@needs_mindspore
def test_two_nodes_in_namespaces_train_the_real_trainer(tmp_path: Path, alloc2: Alloc) -> None:
    """One MindSpore rank per node; the ranks reach the scheduler across the veth pair."""
    args = ["--parallel-mode", "data_parallel", "--epochs", "1", "--steps-per-epoch", "10"]
    t0 = time.monotonic()
    s, out = _two_node_run(tmp_path, alloc2, TRAIN, args)
    nodes = alloc2.cluster.nodes
    for rank, node in enumerate(nodes):
        losses = re.findall(rf"^\[{node} r{rank}\] epoch: \d+ step: \d+, loss is ([0-9.]+)$", out, re.M)
        assert len(losses) == 10, (node, losses)
    print(f"2 MindSpore ranks on 2 Slurm nodes (namespaces): {time.monotonic() - t0:.1f} s")


def test_one_of_two_nodes_lost_comes_back_alone(tmp_path: Path, alloc2: Alloc) -> None:
    """The namespaced node's dial killed: the restart starts a step on that node only
    (srun --nodelist) while the other node's agent stays."""
    lose_a_node(tmp_path, alloc2, alloc2.cluster.nodes[1])
