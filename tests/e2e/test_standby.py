"""Warm restarts on a standby cluster (agent/spares.py, ``restart.standby``), over real sshd nodes
with real MindSpore ranks (the reference trainer, data parallel on CPU, one rank per node).

Once attempt 0's ranks step, each agent starts the next attempt's processes ahead, and they join
their own MindSpore cluster (its scheduler on a port of its own); when every node has said so, a
restart hands the attempt to them. Each case injects a fault from outside and checks what the
restart was (warm or cold), that every rank resumed at the step after the last one it completed
(the trainer's per-step snapshot in /dev/shm) with the very parameters of that step, and that
nothing is left behind. No time is asserted: ``bench/failstop.py`` and ``bench/chaos.py`` measure.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import psutil
import pytest
from conftest import (
    needs_mindspore,
    node_run_dir,
    run_process,
    run_processes,
    slow_twin,
    wait_for,
    wait_gone,
)
from mscon.agent import layout
from mscon.agent.journal import read_state
from sshd_nodes import SshdCluster
from test_faults import (
    TRAIN,
    Console,
    _inventory,
    _ranks,
    _run_id,
    _start,
    _summary,
    nothing_under_sshd,
)

pytestmark = [pytest.mark.ssh, pytest.mark.mindspore(ranks=2)]  # 2 ranks; their spares wait idle (no slot)

# Long enough to still be training when each case has done its part (the case then stops the run):
# the standby joins while attempt 0 trains, which takes seconds on a loaded machine.
ARGS = [
    "--parallel-mode", "data_parallel", "--epochs", "1", "--steps-per-epoch", "4000",
    "--step-sleep", "0.05", "--checksum-every", "1",
]  # fmt: skip
TRAINED_BEFORE_A_FAULT = 20  # steps: past the snapshots' probe and a checkpoint's interval or not, resumable
STEP = re.compile(r"^epoch: 1 step: (\d+), loss is", re.M)
RESUMED = re.compile(
    # a checkpoint step is also a snapshot step: the trainer names the checkpoint then (the same state)
    r"mscon-trainer: resumed from step (\d+) \((?:snapshot|checkpoint) saved [^)]*\); "
    r"parameter checksum (\w+)"
)


def _launch(
    tmp_path: Path, cluster: SshdCluster, request: pytest.FixtureRequest, case: str, max_restarts: int
) -> tuple[Console, str]:
    """The run, once every node's standby for attempt 1 is ready and every rank has trained a few
    steps (the spares start with a cold attempt and may be ready before its first step: a fault
    then has nothing to resume from)."""
    inv = _inventory(tmp_path, cluster, 1, ARGS, script=TRAIN)
    run_id = _run_id(case)
    con = _start(tmp_path, inv, run_id, "--max-restarts", str(max_restarts))
    request.addfinalizer(con.kill)
    _standby_ready(con, 1)
    for node, name in (("node1", "r0"), ("node2", "r1")):
        con.wait_line("out", f"[{node} {name}] epoch: 1 step: {TRAINED_BEFORE_A_FAULT},", 300)
    return con, run_id


def _stepping_again(con: Console, timeout: float = 180) -> None:
    """Every rank printed its resume line and then a step no rank reached before the fault (the
    resume step + 3: a survivor may have finished at most one step more than the victim)."""
    for node, name in (("node1", "r0"), ("node2", "r1")):
        con.wait_line("out", f"[{node} {name}] mscon-trainer: resumed from step", timeout)
        said = re.findall(rf"\[{node} {name}\] mscon-trainer: resumed from step (\d+)", con.text("out"))
        con.wait_line("out", f"[{node} {name}] epoch: 1 step: {int(said[-1]) + 3}, loss", 60)


def _standby_ready(con: Console, attempt: int) -> None:
    for node in ("node1", "node2"):
        con.wait_line("err", f"mscon: {node}: standby for attempt {attempt} ready", 300)


def _steps(tmp_path: Path, run_id: str, node: str, attempt: int, name: str) -> list[int]:
    log = Path(layout.log_path(tmp_path / "runs" / run_id / node, attempt, name)).read_text()
    return [int(s) for s in STEP.findall(log)]


def _resumed(tmp_path: Path, run_id: str, node: str, attempt: int, name: str) -> tuple[int, str]:
    log = Path(layout.log_path(tmp_path / "runs" / run_id / node, attempt, name)).read_text()
    found = RESUMED.search(log)
    assert found, f"{node} {name} attempt {attempt} did not resume at its last step:\n{log[-2000:]}"
    return int(found.group(1)), found.group(2)


def _checksum_at(tmp_path: Path, run_id: str, node: str, attempt: int, name: str, step: int) -> str:
    path = Path(layout.metrics_path(tmp_path / "runs" / run_id / node, attempt, name))
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("step") == step and "param_checksum" in record:
            return record["param_checksum"]
    raise AssertionError(f"no checksum of step {step} in {path}")


def _stop_and_check_clean(con: Console, run_id: str, cluster: SshdCluster) -> None:
    """Stop the run as an operator does (SIGINT), then: nothing of it left anywhere."""
    con.proc.send_signal(signal.SIGINT)
    rc = con.finish(120)
    assert rc == 130, con.text("err")[-3000:]
    assert run_processes(run_id) == []
    assert wait_gone(_spares_of(run_id), 10) == []
    nothing_under_sshd(cluster)


def _taken(run_dir: Path, attempt: int, name: str, pid: int) -> bool:
    """The node's agent has made ``pid`` its process ``name`` of ``attempt`` (its state.json)."""
    state = read_state(str(run_dir)) or {}
    procs = state.get("procs", []) if state.get("attempt") == attempt else []
    return any(p.get("name") == name and p.get("pid") == pid for p in procs)


def _spares_of(run_id: str) -> list[psutil.Process]:
    """The run's processes still waiting as spares (process name mscon-spare)."""
    found = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == "mscon-spare" and run_id in p.environ().get("MSCON_METRICS", ""):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _check_one_step_resume(tmp_path: Path, run_id: str, victim_last: int) -> int:
    """Every rank of attempt 1 resumed at the same step, at most one before the victim's last,
    with the parameters attempt 0 had after that step, and went on from the step after it."""
    r0_step, r0_sum = _resumed(tmp_path, run_id, "node1", 1, "r0")
    r1_step, r1_sum = _resumed(tmp_path, run_id, "node2", 1, "r1")
    assert r0_step == r1_step and r0_sum == r1_sum
    assert victim_last - 1 <= r0_step <= victim_last, (r0_step, victim_last)
    assert r0_sum == _checksum_at(tmp_path, run_id, "node1", 0, "r0", r0_step)
    for node, name in (("node1", "r0"), ("node2", "r1")):
        assert _steps(tmp_path, run_id, node, 1, name)[0] == r0_step + 1
    return r0_step


@needs_mindspore
def test_kill9_of_a_rank_restarts_warm_at_the_next_step(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    con, run_id = _launch(tmp_path, sshd_cluster, request, "warm", 1)
    victim = _ranks(run_id, 2)["r1"]
    victim.kill()
    con.wait_line("err", "mscon: attempt 1 starts warm: its processes are the standby cluster's", 60)
    _stepping_again(con)
    _stop_and_check_clean(con, run_id, sshd_cluster)  # the logs are fetched as the run ends
    victim_last = _steps(tmp_path, run_id, "node2", 0, "r1")[-1]
    _check_one_step_resume(tmp_path, run_id, victim_last)
    s = _summary(tmp_path)
    a0, a1 = s["attempts"]
    assert (a0["outcome"], a0["root_cause"]["name"], a0["root_cause"]["signal"]) == (
        "failed",
        "r1",
        "SIGKILL",
    )
    assert a1["phases"]["warm"] is True and a0["phases"]["warm"] is False
    # Attempt 1's processes had joined their cluster before it began (the spares' markers), and its
    # scheduler's output from its start on is in the attempt's log like any scheduler's (a link).
    node1 = tmp_path / "runs" / run_id / "node1"
    spares = {p.name for p in (node1 / layout.SPARES_DIR).iterdir()}
    assert {"r0.1.joined", "sched.1.log"} <= spares
    assert not [n for n in spares if n.endswith(".order.json")]  # every order was read
    sched = Path(layout.log_path(node1, 1, "sched")).read_bytes()
    assert sched == (node1 / layout.SPARES_DIR / "sched.1.log").read_bytes()


@needs_mindspore
@slow_twin(
    "a lost standby making the restart cold: tests/agent/test_spares_units.py and "
    "tests/engine/test_supervisor_policy.py cover it with fake ranks"
)
def test_kill9_of_a_standby_makes_the_restart_cold(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    con, run_id = _launch(tmp_path, sshd_cluster, request, "standby-lost", 1)
    spare = run_process(run_id, 1, "r1")
    assert spare is not None and spare.name() == "mscon-spare"
    spare.kill()
    con.wait_line("err", "mscon: node2: standby for attempt 1 lost: the spare for r1 exited (SIGKILL)", 30)
    victim = _ranks(run_id, 2)["r0"]
    victim.kill()
    _stepping_again(con)
    _stop_and_check_clean(con, run_id, sshd_cluster)
    victim_last = _steps(tmp_path, run_id, "node1", 0, "r0")[-1]
    assert "starts warm" not in con.text("err")
    _check_one_step_resume(tmp_path, run_id, victim_last)
    a0, a1 = _summary(tmp_path)["attempts"]
    assert a1["phases"]["warm"] is False and a0["root_cause"]["name"] == "r0"


@needs_mindspore
def test_kill9_of_the_scheduler_during_a_warm_restart(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    con, run_id = _launch(tmp_path, sshd_cluster, request, "sched-in-restart", 2)
    _ranks(run_id, 2)["r1"].kill()
    con.wait_line("err", "mscon: attempt 1 starts warm", 60)
    sched = run_process(run_id, 1, "sched")  # the standby's scheduler, about to be attempt 1's
    assert sched is not None  # named mscon-spare still: see agent/spare_boot.py
    # "starts warm" is the console's word; node1's agent takes the spare a moment later. Killed
    # before that, the attempt fails to start ("the standby's process for sched is gone"), which
    # is another case: wait until node1's state.json names it as attempt 1's scheduler.
    wait_for(
        lambda: _taken(node_run_dir(run_id, "node1"), 1, "sched", sched.pid),
        60,
        "node1 taking its spare scheduler",
    )
    sched.kill()
    con.wait_line(
        "err", "mscon: attempt 1 failed: the scheduler on node1 failed first (killed by SIGKILL)", 60
    )
    # Attempt 2 starts cold (no standby of its own yet) and resumes where attempt 1 got to.
    con.wait_line("err", "restarting the whole group as attempt 2", 60)
    _stepping_again(con)
    _stop_and_check_clean(con, run_id, sshd_cluster)
    attempts = _summary(tmp_path)["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "failed", "interrupted"]
    assert attempts[1]["root_cause"]["name"] == "sched" and attempts[1]["phases"]["warm"] is True
    assert attempts[2]["phases"]["warm"] is False
    a1_last = max([*_steps(tmp_path, run_id, "node1", 1, "r0"), *_steps(tmp_path, run_id, "node1", 0, "r0")])
    a2_step, _ = _resumed(tmp_path, run_id, "node1", 2, "r0")
    assert a1_last - 1 <= a2_step <= a1_last
