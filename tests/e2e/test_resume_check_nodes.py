"""``mscon check --resume`` on the cluster's nodes: 2 sshd nodes x 1 real MindSpore rank, a
hand-written loop over a sharded NumpySlicesDataset (resume_check_nodes/loop.py). Two runs through
mscon's engine (uninterrupted; killed by the library at a step and restarted by the policy), then
the local check's verdict on what the run folders fetched back hold."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import mscon, needs_mindspore, run_processes, ssh_inventory
from mscon.agent import layout
from sshd_nodes import SshdCluster

SCRIPT = Path(__file__).resolve().parent / "resume_check_nodes" / "loop.py"


def _inventory(tmp_path: Path, cluster: SshdCluster, env: dict[str, str]) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(SCRIPT, work / SCRIPT.name)
    inv = ssh_inventory(tmp_path / "inv.yaml", cluster, 1, SCRIPT.name, [], workdir=work)
    doc = yaml.safe_load(inv.read_text())
    doc["job"]["env"] = env
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


@pytest.mark.ssh
@pytest.mark.mindspore(ranks=2)  # 2 nodes x 1
@needs_mindspore
def test_a_loop_over_batches_resumes_exactly_on_two_nodes(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    inv = _inventory(tmp_path, sshd_cluster, {})
    kept = tmp_path / "kept"
    done = mscon("check", "--resume", inv, "--keep-dir", kept, cwd=tmp_path, timeout=300)
    assert done.code == 0, done.out + done.err[-4000:]
    first = done.out.splitlines()[0]
    assert re.fullmatch(
        r"resumes exactly \(rank 0 resumed after step (\d+); (\d+) steps compared\)", first
    ), done.out
    assert (
        "run 1 of 2: uninterrupted (check-u-" in done.err
        and "run 2 of 2: rank 0 killed after step 10" in done.err
    )
    (u_id,) = [p.name for p in kept.glob("check-u-*")]
    (kr_id,) = [p.name for p in kept.glob("check-kr-*")]
    for node, rank in (("node1", 0), ("node2", 1)):
        for attempt in (0, 1):
            assert Path(layout.log_path(kept / kr_id / node, attempt, f"r{rank}")).is_file(), (node, attempt)
    killed = Path(layout.log_path(kept / kr_id / "node1", 0, "r0")).read_text(errors="replace")
    assert "rank 0 is killed after step 10" in killed, killed[-2000:]
    assert run_processes(u_id) == [] and run_processes(kr_id) == []


@pytest.mark.ssh
@pytest.mark.mindspore(ranks=2)  # 2 nodes x 1
@needs_mindspore
@pytest.mark.skipif(
    not os.environ.get("MSCON_SLOW_TESTS"),
    reason="the refusal is the catalogue's (two_optimizers_tuple) and the node path the test above's: "
    "MSCON_SLOW_TESTS=1 runs it on the nodes too",
)
def test_two_optimizers_in_an_unnamed_tuple_are_refused_on_two_nodes(
    tmp_path: Path, sshd_cluster: SshdCluster
) -> None:
    inv = _inventory(tmp_path, sshd_cluster, {"TWO_OPTIMIZERS": "1"})
    done = mscon("check", "--resume", inv, "--at", "3", cwd=tmp_path, timeout=300)
    assert done.code == 3, done.out + done.err[-4000:]
    first = done.out.splitlines()[0]
    assert first.startswith("refused: ") and re.search(r"beta1_power|global_step", first), done.out
    assert not list(tmp_path.glob("mscon-runs*")), "the runs' folders went to a temp folder, removed"
