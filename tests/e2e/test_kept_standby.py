"""A standby kept for the next run (``restart.keep_warm_s``: agent/keeper.py), over real sshd nodes
with real MindSpore ranks (the reference trainer, data parallel on CPU, one rank per node).

A run that ends by itself leaves, on each node, a keeper holding the next run's first-attempt
processes joined to their own MindSpore cluster; the next run of the job adopts them and its
attempt 0 starts warm. A run of another job ends them and starts cold; a console that dies takes
the adopted ranks with it, and an interrupted run keeps nothing. No time is asserted:
``bench/launch.py --second`` measures.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import mscon, node_home, wait_for, wait_gone
from mscon.agent import layout
from node_files import listing, loose
from sshd_nodes import SshdCluster
from test_faults import TRAIN, _run_id, _start, _summary
from test_faults import _inventory as _fault_inventory

pytestmark = [pytest.mark.ssh, pytest.mark.mindspore(ranks=2)]  # 2 ranks; the kept spares wait idle (no slot)

ARGS = ["--parallel-mode", "data_parallel", "--epochs", "1", "--steps-per-epoch", "10"]
# Node names of this module's own: a node's kept standby is found by its name, and other tests'
# runs on the same sshd nodes (as root: one home), side by side under xdist, would take or end it.
KEPT_NAMES = {"node1": "kept1", "node2": "kept2"}
NODES = {"kept1": "r0", "kept2": "r1"}


def _warm_folder(node: str) -> Path:
    """A node's kept standby: the sshd nodes' agents run in root's passwd home."""
    return Path(layout.cache_folder(str(node_home()))) / layout.KEPT_DIR / node


def _keepers() -> dict[str, psutil.Process]:
    found = {}
    for node in NODES:
        try:
            found[node] = psutil.Process(int((_warm_folder(node) / "keeper.pid").read_text()))
        except (OSError, ValueError, psutil.Error):
            continue
    return found


def _kept_ready(timeout: float = 240) -> dict[str, list[psutil.Process]]:
    """Each node's kept spares, once all have joined their cluster (the scheduler needs no marker)."""

    def ready() -> dict[str, psutil.Process] | None:
        keepers = _keepers()
        joined = all((_warm_folder(n) / f"{name}.joined").exists() for n, name in NODES.items())
        return keepers if len(keepers) == len(NODES) and joined else None

    keepers = wait_for(ready, timeout, "a kept standby ready on every node", lambda: sorted(_keepers()))
    return {n: k.children() for n, k in keepers.items()}


def _held_privately(held: dict[str, list[psutil.Process]]) -> None:
    """A joined standby listens on the node's own address only (MS_SCHED_HOST for its scheduler,
    the address it reaches that from for the others: MindSpore binds what the agent sets), never
    on all addresses; its folder holds only 0600 files in 0700 folders."""
    ports = [
        c.laddr
        for procs in held.values()
        for p in procs
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert ports, "the kept spares listen nowhere: nothing was checked"
    assert all(a.ip not in ("0.0.0.0", "::", "") for a in ports), ports
    for node in NODES:
        assert loose(_warm_folder(node)) == [], listing(_warm_folder(node))


def _end_keepers() -> None:
    keepers = list(_keepers().values())
    for k in keepers:
        try:
            os.kill(k.pid, signal.SIGTERM)  # its spares die with it
        except OSError:
            pass
    assert wait_gone(keepers, 15) == []


@pytest.fixture
def no_keepers() -> Iterator[None]:
    _end_keepers()  # one an earlier, failed case left
    yield
    _end_keepers()


def _inventory(tmp_path: Path, cluster: SshdCluster, devices: int, args: list[str], **kw: object) -> Path:
    nodes = [{"host": n.host, "name": KEPT_NAMES[n.name], "devices": devices} for n in cluster.nodes]
    return _fault_inventory(tmp_path, cluster, devices, args, nodes=nodes, **kw)  # type: ignore[arg-type]


def _run(tmp_path: Path, inv: Path, case: str) -> tuple[int, str]:
    con = _start(tmp_path, inv, _run_id(case))
    rc = con.finish(240)
    return rc, con.text("err")


def test_the_next_run_starts_warm_and_another_job_ends_the_standby(
    tmp_path: Path, sshd_cluster: SshdCluster, no_keepers: None
) -> None:
    inv = _inventory(tmp_path, sshd_cluster, 1, ARGS, script=TRAIN, restart={"keep_warm_s": 600})
    rc, err = _run(tmp_path, inv, "keep")
    assert rc == 0, err[-3000:]
    assert not _summary(tmp_path)["attempts"][0]["phases"]["warm"]  # nothing was kept before it
    # Its keepers serve before the run has ended; the next run, started at once, waits for their
    # spares to join.
    held = {node: k.children() for node, k in _keepers().items()}
    assert sorted(held) == sorted(NODES) and all(len(p) >= 1 for p in held.values())

    rc, err = _run(tmp_path, inv, "adopt")
    assert rc == 0, err[-3000:]
    for node in NODES:
        assert f"mscon: {node}: kept standby taken" in err, err[-3000:]
    assert "attempt 0 starts warm" in err
    summary = _summary(tmp_path)
    assert summary["attempts"][0]["phases"]["warm"] is True
    assert [r["last_step"] for r in summary["ranks"] if r["name"] != "sched"] == [10, 10]
    assert wait_gone([p for procs in held.values() for p in procs], 30) == []  # they were the ranks

    # Another job (its environment differs): the standby the last run kept is not taken but ended.
    held = _kept_ready()
    _held_privately(held)
    other = _inventory(
        tmp_path,
        sshd_cluster,
        1,
        ARGS,
        script=TRAIN,
        restart={"keep_warm_s": 600},
        job={"env": {"GLOG_v": "2"}},
    )
    rc, err = _run(tmp_path, other, "other")
    assert rc == 0, err[-3000:]
    assert "kept standby not taken (" in err and "environment differs in GLOG_v" in err, err[-3000:]
    assert not _summary(tmp_path)["attempts"][0]["phases"]["warm"]
    assert wait_gone([p for procs in held.values() for p in procs], 30) == []


def test_an_interrupted_run_keeps_nothing(
    tmp_path: Path, sshd_cluster: SshdCluster, no_keepers: None
) -> None:
    args = [*ARGS[:-1], "100000", "--step-sleep", "0.05"]
    inv = _inventory(tmp_path, sshd_cluster, 1, args, script=TRAIN, restart={"keep_warm_s": 600})
    con = _start(tmp_path, inv, _run_id("interrupted"))
    try:
        for node, name in NODES.items():
            con.wait_line("out", f"[{node} {name}] epoch: 1 step: 3, loss", 120)
        con.proc.send_signal(signal.SIGINT)
        assert con.finish(60) == 130
    finally:
        con.kill()
    assert _keepers() == {}


def test_a_detached_run_keeps_one_as_it_ends_and_an_attached_run_takes_it_and_dies_with_its_console(
    tmp_path: Path, sshd_cluster: SshdCluster, no_keepers: None
) -> None:
    """Detached, the nodes end the run themselves: each keeps its standby then, as an attached
    run's agents do on the console's Shutdown. The attached run that takes it (the same job with
    other arguments: the order gives them, the spares only imported and joined) is training when
    its console dies: the adopted ranks die with it, and nothing is kept for a next run."""
    inv = _inventory(tmp_path, sshd_cluster, 1, ARGS, script=TRAIN, restart={"keep_warm_s": 600})
    done = mscon(
        "run", "--no-tui", "--detach", inv, "--run-id", _run_id("detached"), cwd=tmp_path, timeout=120
    )
    assert done.code == 0, done.err[-3000:]
    held = _kept_ready()  # the run ended on the nodes (10 steps), and each node's keeper has joined
    keepers = list(_keepers().values())
    long_run = [*ARGS[:-1], "100000", "--step-sleep", "0.05"]
    port = yaml.safe_load(inv.read_text())["scheduler"]["port"]
    inv = _inventory(
        tmp_path,
        sshd_cluster,
        1,
        long_run,
        script=TRAIN,
        restart={"keep_warm_s": 600},
        scheduler={"port": port},
    )
    con = _start(tmp_path, inv, _run_id("crash"))
    try:
        con.wait_line("err", "attempt 0 starts warm", 120)
        for node, name in NODES.items():
            con.wait_line("out", f"[{node} {name}] epoch: 1 step: 3, loss", 120)
    finally:
        con.proc.kill()  # SIGKILL: no goodbye to the agents
        con.proc.wait()
    # The ranks were the kept spares, the keepers their parents: nothing holds a device on.
    assert wait_gone([p for procs in held.values() for p in procs] + keepers, 30) == []
    assert _keepers() == {}  # and it kept none for a next run
