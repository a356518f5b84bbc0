"""End to end over real sshd nodes on 127.0.0.2 and 127.0.0.3: real MindSpore ranks where it matters."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import (
    REPO,
    agent_processes,
    mscon,
    mscon_popen,
    needs_mindspore,
    node_home,
    run_processes,
    ssh_inventory,
    use_ssh_config_aliases,
    wait_gone,
    wait_run_processes,
)
from mscon.agent import layout
from sshd_nodes import SshdCluster

pytestmark = pytest.mark.ssh
FAKE = "bench/fake_rank.py"
TRAIN = "trainer/train.py"


def _sshd_pids(cluster: SshdCluster) -> list[int]:
    return [n.pid for n in cluster.nodes]


def _summary(path: Path) -> dict:
    return json.loads(path.read_text())


def _wait_for_line(proc, needle: str, timeout: float = 180) -> list[str]:  # noqa: ANN001
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return seen
        assert time.monotonic() < deadline, f"{needle!r} not seen in time; last lines: {seen[-20:]}"
    raise AssertionError(f"output ended before {needle!r}; stderr: {proc.stderr.read()[-3000:]}")


@pytest.mark.mindspore(ranks=4)
@needs_mindspore
def test_two_nodes_train_real_mindspore(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    args = ["--parallel-mode", "data_parallel", "--epochs", "2", "--steps-per-epoch", "10"]
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 2, TRAIN, args)
    done = mscon("run", "--no-tui", inv, "--json", tmp_path / "s.json", cwd=tmp_path, timeout=300)
    assert done.code == 0, done.err[-4000:]
    first_loss = {}
    for node, rank in (("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)):
        losses = re.findall(rf"^\[{node} r{rank}\] epoch: \d+ step: \d+, loss is ([0-9.]+)$", done.out, re.M)
        assert len(losses) == 20, (node, rank, losses)
        first_loss[rank] = float(losses[0])
    s = _summary(tmp_path / "s.json")
    workers = {r["rank"]: r for r in s["ranks"] if r["rank"] >= 0}
    assert sorted(workers) == [0, 1, 2, 3]
    for rank, r in workers.items():
        assert r["status"] == "ok" and r["last_step"] == 20
        assert r["last_loss"] < first_loss[rank]  # it learns
    logs = Path(s["logs_dir"])
    assert "training finished" in Path(layout.log_path(logs / "node1", 0, "r0")).read_text()
    assert "training finished" in Path(layout.log_path(logs / "node2", 0, "r3")).read_text()
    assert Path(layout.log_path(logs / "node1", 0, "sched")).is_file()
    # One record a step (besides the phase and resume records)
    records = Path(layout.metrics_path(logs / "node2", 0, "r2")).read_text().splitlines()
    assert sum(line.startswith('{"step"') for line in records) == 20


@pytest.mark.mindspore(ranks=4)
@needs_mindspore
def test_kill9_one_rank_stops_every_rank_within_5s(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
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
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 2, TRAIN, args)
    run_id = f"kill9-{secrets.token_hex(3)}"
    proc = mscon_popen(
        "run", "--no-tui", inv, "--run-id", run_id, "--json", tmp_path / "s.json", cwd=tmp_path
    )
    request.addfinalizer(proc.kill)
    _wait_for_line(proc, "[node2 r3] epoch: 1 step: 5,")
    procs = run_processes(run_id)
    victim = [p for p in procs if p.environ()["MSCON_METRICS"].endswith("/r3" + layout.METRICS_SUFFIX)]
    assert len(procs) == 5 and len(victim) == 1  # scheduler + 4 ranks
    others = [p for p in procs if p.pid != victim[0].pid]
    victim[0].send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    survivors = wait_gone(others, 5.0)
    took = time.monotonic() - t0
    assert survivors == [], f"still running {took:.1f} s after the kill: {survivors}"
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 137, err[-3000:]
    s = _summary(tmp_path / "s.json")
    assert s["root_cause"]["name"] == "r3" and s["root_cause"]["node"] == "node2"
    assert s["root_cause"]["signal"] == "SIGKILL"
    assert "r3 on node2 failed first (killed by SIGKILL)" in err
    fetched = Path(s["logs_dir"])  # logs come back after a failure too, from both nodes
    assert "step: 5," in Path(layout.log_path(fetched / "node2", 0, "r3")).read_text()
    assert Path(layout.log_path(fetched / "node1", 0, "r0")).is_file()
    print(f"all ranks gone {took:.2f} s after kill -9")


@pytest.mark.mindspore
@needs_mindspore
def test_unmodified_user_script(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(Path(__file__).parent / "user_mindspore_script.py", work / "plain_train.py")
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 1, FAKE, [])
    done = mscon(
        "run",
        "--no-tui",
        inv,
        "--workdir",
        work,
        "--json",
        tmp_path / "s.json",
        "--",
        "plain_train.py",
        cwd=tmp_path,
        timeout=300,
    )
    assert done.code == 0, done.err[-4000:]
    assert "[node1 r0] user script done" in done.out and "[node2 r1] user script done" in done.out
    workers = [r for r in _summary(tmp_path / "s.json")["ranks"] if r["rank"] >= 0]
    # LossMonitor lines were parsed into metrics: 2 epochs x 8 steps per rank.
    assert all(r["last_loss"] is not None and r["last_step"] == 8 for r in workers), workers


def test_fake_ranks_and_agent_reuse(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 2, FAKE, ["--steps", "5", "--rate", "0"])
    first = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert first.code == 0, first.err
    # The node user's home as sshd sets it (from passwd), not this process's $HOME.
    cache = Path(layout.cache_folder(str(node_home())))
    markers = list(cache.glob(f"{layout.AGENT_PREFIX}*/mscon_agent/.complete"))
    assert markers
    stamp = {m: m.stat().st_mtime_ns for m in markers}
    second = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert second.code == 0, second.err
    assert {m: m.stat().st_mtime_ns for m in markers} == stamp  # same content hash: not uploaded again


def test_changed_host_key_is_refused(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    sshd_cluster.rotate_host_key("node2")
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 1, FAKE, ["--steps", "5"])
    done = mscon("run", "--no-tui", inv, "--accept-new-host-keys", cwd=tmp_path)
    assert done.code == 4, done.err
    assert "node2 (127.0.0.3" in done.err and "HOST KEY MISMATCH" in done.err
    assert "Traceback" not in done.err
    assert agent_processes(["node1", "node2"], _sshd_pids(sshd_cluster)) == []  # nothing was started anywhere


def test_unknown_host_key_needs_explicit_opt_in(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 1, FAKE, ["--steps", "3", "--rate", "0"])
    inv.write_text(inv.read_text().replace(str(sshd_cluster.known_hosts), str(empty)))
    refused = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert refused.code == 4 and "unknown host key" in refused.err, refused.err
    accepted = mscon("run", "--no-tui", inv, "--accept-new-host-keys", cwd=tmp_path)
    assert accepted.code == 0, accepted.err
    assert len(empty.read_text().splitlines()) == 2
    again = mscon("run", "--no-tui", inv, cwd=tmp_path)  # now known: no opt-in needed
    assert again.code == 0, again.err


def test_unreachable_node_exits_4(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    sshd_cluster.stop_node("node2")
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 1, FAKE, ["--steps", "3"])
    t0 = time.monotonic()
    done = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert done.code == 4 and "node2" in done.err and "cannot connect" in done.err, done.err
    assert time.monotonic() - t0 < 15


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_console_stop_or_crash_leaves_no_process(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest, how: str
) -> None:
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 2, FAKE, ["--steps", "100000", "--rate", "10"])
    run_id = f"{how}-{secrets.token_hex(3)}"
    proc = mscon_popen("run", "--no-tui", inv, "--run-id", run_id, cwd=tmp_path)
    request.addfinalizer(proc.kill)
    _wait_for_line(proc, "[node2 r3] epoch: 1 step: 3,")
    # node1's ranks may still be starting when node2's print (a loaded machine): wait for all 4.
    ranks = wait_run_processes(run_id, 4, 30)
    agents = agent_processes(["node1", "node2"], _sshd_pids(sshd_cluster))
    assert len(agents) == 2
    if how == "sigint":
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == 130
    else:
        proc.kill()
        proc.wait()
    assert wait_gone(ranks + agents, 10) == []
    assert run_processes(run_id) == []
    if how == "sigint":  # a clean stop still fetched every node's logs
        fetched = list((tmp_path / layout.LOGS_DIR / run_id).glob(layout.log_path("node*", 0, "r*")))
        assert len(fetched) == 4


_ = (REPO, psutil)


def test_hosts_resolve_through_ssh_config(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    """Node names that exist only in an ssh config (HostName, Port, User, IdentityFile), like `ssh HOST`."""
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 1, FAKE, ["--steps", "3", "--rate", "0"])
    use_ssh_config_aliases(inv, sshd_cluster)
    done = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert done.code == 0, done.err
    assert "[node2 r1] training finished" in done.out
    # known_hosts is keyed by the resolved HostName:Port, exactly as OpenSSH does it.
    sshd_cluster.rotate_host_key("node1")
    refused = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert refused.code == 4 and "HOST KEY MISMATCH" in refused.err, refused.err


def test_wrong_python_on_a_node_is_named(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    inv = ssh_inventory(tmp_path / "inv.yaml", sshd_cluster, 1, FAKE, ["--steps", "3"])
    doc = yaml.safe_load(inv.read_text())
    doc["nodes"][1]["python"] = "/opt/no-such-venv/bin/python3"
    inv.write_text(yaml.safe_dump(doc))
    done = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert done.code == 4, done.err
    assert "node2: the agent did not start with /opt/no-such-venv/bin/python3" in done.err
    assert "No such file or directory" in done.err
    assert (
        agent_processes(["node1", "node2"], _sshd_pids(sshd_cluster)) == []
    )  # node1's agent was told to leave
