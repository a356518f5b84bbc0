"""The hang limit that follows the job (agent/policy.py ``HangRule``), with no ``hang.timeout_s``,
over real sshd nodes with real MindSpore ranks (the reference trainer, data parallel on CPU, one
rank per node): a rank silent in a job that steps every 50 ms is called hung at the steady limit
(20 x its longest step gap, at least 9 s), not after minutes; a first step that takes longer than
that steady limit (a slow compile) is not a hang. Times are printed, not asserted (bench/failstop.py
measures); what is asserted is which limit fired and why, as the summary says it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import needs_mindspore
from mscon.agent import policy
from sshd_nodes import SshdCluster
from test_faults import TRAIN, _inventory, _report, _run_id, _start, _summary, nothing_under_sshd

pytestmark = [pytest.mark.ssh, pytest.mark.mindspore]

FAST = ["--parallel-mode", "data_parallel", "--epochs", "1", "--step-sleep", "0.05"]


@needs_mindspore
def test_a_silent_rank_in_a_fast_job_is_hung_at_the_steady_limit(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    args = [*FAST, "--steps-per-epoch", "4000", "--stall-at-step", "60", "--stall-rank", "1"]
    inv = _inventory(tmp_path, sshd_cluster, 1, args, script=TRAIN)
    run_id = _run_id("fast-hang")
    con = _start(tmp_path, inv, run_id)
    request.addfinalizer(con.kill)
    last = con.wait_line("out", "[node2 r1] epoch: 1 step: 59,", 240)
    named = con.wait_line("err", "r1 on node2 makes no progress", 120)
    rc = con.finish(120)
    _report("a rank silent at step 60, 50 ms steps, derived limit", named_after_its_last_step=named - last)
    assert rc == 124, con.text("err")[-3000:]
    root = _summary(tmp_path)["root_cause"]
    assert root["kind"] == "hung" and root["code"] == 124
    # r0 fell silent too, waiting in the AllReduce for r1, within milliseconds of it: the cause is
    # the rank that is not waiting in the collective (its stack), not the first by the clock.
    assert root["name"] == "r1", root
    # The steady limit fired, not the start-up one, and the summary says why it was that long.
    fired = re.search(r"no progress for ([\d.]+) s \(20 x its longest gap between steps", root["detail"])
    assert fired, root
    assert policy.STEADY_FLOOR_S <= float(fired[1]) < policy.FIRST_STEPS_LIMIT_S
    nothing_under_sshd(sshd_cluster)


@needs_mindspore
def test_a_first_step_slower_than_the_steady_limit_is_not_a_hang(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    stall_s = policy.STEADY_FLOOR_S + 6  # silent this long before the first step, on every rank
    args = [*FAST, "--steps-per-epoch", "20", "--stall-at-step", "1", "--stall-rank", "-1"]
    args += ["--stall-s", str(stall_s)]
    inv = _inventory(tmp_path, sshd_cluster, 1, args, script=TRAIN)
    run_id = _run_id("slow-compile")
    con = _start(tmp_path, inv, run_id)
    request.addfinalizer(con.kill)
    rc = con.finish(300)
    assert rc == 0, con.text("err")[-3000:]
    assert "makes no progress" not in con.text("err") and "hung" not in con.text("err")
    s = _summary(tmp_path)
    assert s["status"] == "succeeded"
    phases = s["attempts"][0]["phases"]
    assert phases["first_step"] - phases["ready"] >= stall_s  # the silence really came before it
    nothing_under_sshd(sshd_cluster)
