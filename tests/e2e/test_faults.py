"""The fault matrix: inject one fault into a running job, then check what mscon did about it.

Every case asserts (1) how long mscon took to notice (from the moment the test injected the fault
to the moment the matching notice line appeared on mscon's stderr, read line by line in a thread),
(2) the root cause it named (``--json``) and its exit code, and (3) that nothing is left: no rank
or scheduler of the run (``run_processes``), no agent, and nothing under the nodes' sshd.

Fast fake ranks (``bench/fake_rank.py``) over real sshd nodes for most cases, real MindSpore
where the case is about training. Run with ``-s`` to see the measured times.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import (
    mscon,
    mscon_popen,
    needs_mindspore,
    pipe_bytes,
    run_processes,
    ssh_inventory,
    wait_for,
    wait_gone,
)
from mscon.agent import layout
from netns_node import NetnsNode, netns_unavailable_reason, start_netns_node
from sshd_nodes import SSHD, SshdCluster, descendants, pid_alive, write_known_hosts

pytestmark = pytest.mark.ssh

FAKE = "bench/fake_rank.py"
TRAIN = "trainer/train.py"
ENDLESS = ["--steps", "100000", "--rate", "20"]  # a fake job that runs until it is stopped


# ------------------------------------------------------------------ mscon under test


class Console:
    """A running ``mscon run``: stdout and stderr read line by line in threads, each line stamped
    with ``time.monotonic()`` when the test received it."""

    def __init__(self, proc: subprocess.Popen[str], read_stdout: bool = True) -> None:
        self.proc = proc
        self.lines: dict[str, list[tuple[float, str]]] = {"out": [], "err": []}
        self._cond = threading.Condition()
        self._open = {"out": read_stdout, "err": True}
        self._threads = [threading.Thread(target=self._read, args=("err", proc.stderr), daemon=True)]
        if read_stdout:
            self._threads.append(threading.Thread(target=self._read, args=("out", proc.stdout), daemon=True))
        for t in self._threads:
            t.start()

    def _read(self, stream: str, f) -> None:  # noqa: ANN001
        for line in f:
            stamp = time.monotonic()
            with self._cond:
                self.lines[stream].append((stamp, line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._open[stream] = False
            self._cond.notify_all()

    def wait_line(self, stream: str, needle: str, timeout: float = 60) -> float:
        """When the first line containing ``needle`` arrived on ``stream`` (monotonic seconds);
        waits for it up to ``timeout`` seconds, or until the stream ends."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for stamp, line in self.lines[stream]:
                    if needle in line:
                        return stamp
                left = deadline - time.monotonic()
                if left <= 0 or not self._open[stream]:
                    break
                self._cond.wait(left)
        raise AssertionError(
            f"{needle!r} not on {stream} ({'timed out' if self._open[stream] else 'stream ended'}); "
            f"stderr so far:\n{self.text('err')[-3000:]}"
        )

    def text(self, stream: str) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines[stream])

    def finish(self, timeout: float = 60) -> int:
        rc = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _start(tmp_path: Path, inv: Path, run_id: str, *extra: str | Path, read_stdout: bool = True) -> Console:
    proc = mscon_popen(
        "run",
        "--no-tui",
        inv,
        "--run-id",
        run_id,
        "--json",
        tmp_path / "s.json",
        "--logs-dir",
        tmp_path / "runs",
        *extra,
        cwd=tmp_path,
    )
    return Console(proc, read_stdout=read_stdout)


def _run_id(case: str) -> str:
    return f"faults-{case}-{secrets.token_hex(3)}"


def _summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "s.json").read_text())


def _inventory(
    tmp_path: Path,
    cluster: SshdCluster,
    devices: int,
    args: list[str],
    script: str = FAKE,
    nodes: list[dict] | None = None,
    **top: dict,
) -> Path:
    """``ssh_inventory`` plus top-level sections (hang, ssh, restart, ...) merged in."""
    inv = ssh_inventory(tmp_path / "inv.yaml", cluster, devices, script, args)
    doc = yaml.safe_load(inv.read_text())
    if nodes is not None:
        doc["nodes"] = nodes
    for key, value in top.items():
        doc[key] = {**doc.get(key, {}), **value}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


# ------------------------------------------------------------------ processes


def _ranks(run_id: str, expect: int, timeout: float = 30) -> dict[str, psutil.Process]:
    """The run's worker ranks by name ("r0"...), once ``expect`` of them run, each with ``.node``
    (its node's name) and ``.agent_pid`` (its parent, the node's agent)."""
    found: dict[str, psutil.Process] = {}

    def all_found() -> bool:
        found.clear()
        for p in run_processes(run_id):
            try:
                path = Path(p.environ()["MSCON_METRICS"])
            except (psutil.Error, KeyError):
                continue
            name = path.name.removesuffix(layout.METRICS_SUFFIX)
            if re.fullmatch(r"r\d+", name):
                try:
                    p.agent_pid = p.ppid()
                except psutil.Error:
                    continue
                p.node = path.parent.parent.name  # the run folder (.../<run id>/<node>) of its attempt folder
                found[name] = p
        return len(found) >= expect

    wait_for(all_found, timeout, f"{expect} ranks of {run_id}", lambda: f"found {sorted(found)}")
    assert len(found) == expect, f"expected {expect} ranks of {run_id}, found {sorted(found)}"
    return found


def _agents(ranks: Iterable[psutil.Process]) -> list[psutil.Process]:
    """The agents that launched these ranks (their parents)."""
    agents = {p.agent_pid: psutil.Process(p.agent_pid) for p in ranks}
    for a in agents.values():
        assert any("mscon_agent" in w for w in a.cmdline()), a.cmdline()
    return list(agents.values())


def _gone_after(procs: list[psutil.Process], t0: float, timeout: float, poll_s: float = 0.01) -> float | None:
    """Seconds from ``t0`` until every process is gone (polled every ``poll_s``); None if not."""
    alive = list(procs)
    while True:
        alive = [p for p in alive if _alive(p)]
        now = time.monotonic()
        if not alive:
            return now - t0
        if now - t0 > timeout:
            return None
        time.sleep(poll_s)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _under_sshd(cluster: SshdCluster) -> list[int]:
    """Processes below the cluster's running sshd listeners (sessions, agents, ranks)."""
    return [d for n in cluster.nodes if cluster.is_running(n) for d in descendants(n.pid) if pid_alive(d)]


def _assert_nothing_left(
    run_id: str,
    procs: list[psutil.Process],
    cluster: SshdCluster | None = None,
    timeout: float = 10,
) -> None:
    assert wait_gone(procs, timeout) == [], f"still running: {[p.pid for p in procs if _alive(p)]}"
    assert run_processes(run_id) == []
    if cluster is not None:
        nothing_under_sshd(cluster, timeout)


def _kill_sshd_with_sessions(cluster: SshdCluster, name: str) -> list[int]:
    """SIGKILL a node's sshd and every per-connection sshd it forked, leaving their children (the
    agent, its ranks) alive: the node's side of every connection is gone at once, as when the
    node's sshd dies. ``SshdCluster.stop_node`` is not used for this: it kills the deepest
    processes first (the ranks), which would make the ranks' deaths, not the lost node, the
    first failure."""
    listener = cluster.node(name).pid
    victims = [listener] + [
        p
        for p in descendants(listener)
        if _exe(p) == SSHD  # sshd: root@notty, its privsep parent
    ]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _root_cause_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("Root cause (first failure")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def _report(case: str, **figures: float | None) -> None:
    shown = ", ".join(f"{k} {v:.3f} s" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
    print(f"\n[fault] {case}: {shown}")


# ------------------------------------------------------------------ 1. kill -9 of a rank


def test_kill9_rank_stops_every_rank_within_1s(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    inv = _inventory(tmp_path, sshd_cluster, 2, ENDLESS)
    run_id = _run_id("kill9")
    con = _start(tmp_path, inv, run_id)
    request.addfinalizer(con.kill)
    con.wait_line("out", "[node2 r3] epoch: 1 step: 3,")
    ranks = _ranks(run_id, 4)
    agents = _agents(ranks.values())
    others = [p for name, p in ranks.items() if name != "r2"]
    t0 = time.monotonic()
    ranks["r2"].send_signal(signal.SIGKILL)
    all_gone = _gone_after(others, t0, timeout=5.0)
    detected = con.wait_line("err", "mscon: r2 on node2 failed: killed by SIGKILL", 10) - t0
    rc = con.finish()
    _report("kill -9 of r2", noticed=detected, every_rank_gone=all_gone)
    assert all_gone is not None and all_gone < 1.0, f"ranks still running 1 s after the kill ({all_gone})"
    assert detected < 1.0
    assert rc == 137, con.text("err")[-3000:]
    root = _summary(tmp_path)["root_cause"]
    assert (root["kind"], root["name"], root["node"], root["signal"]) == ("signal", "r2", "node2", "SIGKILL")
    assert "r2 on node2 failed first (killed by SIGKILL)" in _root_cause_line(con.text("err"))
    _assert_nothing_left(run_id, agents, sshd_cluster)


# ------------------------------------------------------------------ 2. SIGSTOP of a rank


def test_sigstop_rank_is_named_stopped(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    inv = _inventory(tmp_path, sshd_cluster, 2, ENDLESS)
    run_id = _run_id("sigstop")
    con = _start(tmp_path, inv, run_id)
    request.addfinalizer(con.kill)
    con.wait_line("out", "[node2 r3] epoch: 1 step: 3,")
    ranks = _ranks(run_id, 4)
    agents = _agents(ranks.values())
    t0 = time.monotonic()
    ranks["r1"].send_signal(signal.SIGSTOP)
    request.addfinalizer(lambda: _alive(ranks["r1"]) and ranks["r1"].kill())
    detected = con.wait_line("err", "mscon: r1 on node1 stopped by a signal (process state T (stopped))", 10)
    rc = con.finish()
    _report("SIGSTOP of r1", noticed=detected - t0, mscon_exited=time.monotonic() - t0)
    assert detected - t0 < 5.0
    assert rc == 124, con.text("err")[-3000:]
    root = _summary(tmp_path)["root_cause"]
    assert (root["kind"], root["name"], root["node"], root["code"]) == ("stopped", "r1", "node1", 124)
    assert "r1 on node1 hung first (stopped by a signal" in _root_cause_line(con.text("err"))
    _assert_nothing_left(run_id, list(ranks.values()) + agents, sshd_cluster)  # the stopped rank too


# ------------------------------------------------------------------ 3. a rank that hangs in silence


def test_silent_rank_is_named_hung_with_its_stack(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    timeout_s = 5
    args = ENDLESS + ["--hang-rank", "1", "--fail-step", "5"]
    inv = _inventory(tmp_path, sshd_cluster, 2, args, hang={"timeout_s": timeout_s})
    run_id = _run_id("hang")
    con = _start(tmp_path, inv, run_id)
    request.addfinalizer(con.kill)
    last_line = con.wait_line("out", "[node1 r1] rank 1 hanging at step 5")
    ranks = _ranks(run_id, 4)
    agents = _agents(ranks.values())
    detected = con.wait_line("err", "mscon: r1 on node1 makes no progress", timeout_s + 30)
    rc = con.finish()
    silent = detected - last_line
    _report("r1 silent (hang.timeout_s 5)", noticed_after_last_line=silent)
    assert timeout_s - 0.5 < silent < timeout_s + 2, silent
    assert rc == 124, con.text("err")[-3000:]
    root = _summary(tmp_path)["root_cause"]
    assert (root["kind"], root["name"], root["node"], root["code"]) == ("hung", "r1", "node1", 124)
    assert "rank 1 hanging at step 5" in root["tail"]
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if py_spy:  # the Python stack, taken on the node with py-spy dump
        assert "fake_rank.py" in root["stack"] and "main" in root["stack"], root["stack"]
    else:  # the kernel wait channel of the sleeping process
        assert root["stack"].startswith("kernel wait channel: "), root["stack"]
    err = con.text("err")
    assert "r1 on node1 hung first (no progress" in _root_cause_line(err)
    assert "  where it was stuck:" in err
    _assert_nothing_left(run_id, list(ranks.values()) + agents, sshd_cluster)


# ------------------------------------------------------------------ 4. kill -9 of an agent


def test_kill9_agent_loses_its_node(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    inv = _inventory(tmp_path, sshd_cluster, 2, ENDLESS)
    run_id = _run_id("agent")
    con = _start(tmp_path, inv, run_id)
    request.addfinalizer(con.kill)
    con.wait_line("out", "[node2 r3] epoch: 1 step: 3,")
    ranks = _ranks(run_id, 4)
    node2 = [p for p in ranks.values() if p.node == "node2"]
    node1 = [p for p in ranks.values() if p.node == "node1"]
    (agent2,) = _agents(node2)
    (agent1,) = _agents(node1)
    t0 = time.monotonic()
    agent2.kill()
    orphans_gone = _gone_after(node2, t0, timeout=5.0)  # the parent-death signal
    detected = con.wait_line("err", "mscon: node2: lost:", 10) - t0
    node1_gone = _gone_after(node1, t0, timeout=10.0)
    rc = con.finish()
    _report(
        "kill -9 of node2's agent",
        noticed=detected,
        node2_ranks_gone=orphans_gone,
        node1_ranks_gone=node1_gone,
    )
    assert orphans_gone is not None and orphans_gone < 1.0
    assert detected < 2.0 and node1_gone is not None and node1_gone < 3.0
    assert rc == 4, con.text("err")[-3000:]
    root = _summary(tmp_path)["root_cause"]
    assert (root["kind"], root["node"], root["code"]) == ("node lost", "node2", 4)
    assert "lost the node node2" in _root_cause_line(con.text("err"))
    _assert_nothing_left(run_id, list(ranks.values()) + [agent1, agent2], sshd_cluster)


# ------------------------------------------------------------------ 5. a node's sshd dies, connections too


def test_sshd_killed_with_its_sessions_loses_the_node(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    keepalive_s = 1
    inv = _inventory(tmp_path, sshd_cluster, 2, ENDLESS, ssh={"keepalive_s": keepalive_s})
    run_id = _run_id("sshd")
    con = _start(tmp_path, inv, run_id)
    request.addfinalizer(con.kill)
    con.wait_line("out", "[node2 r3] epoch: 1 step: 3,")
    ranks = _ranks(run_id, 4)
    agents = _agents(ranks.values())
    node1 = [p for p in ranks.values() if p.node == "node1"]
    node2 = [p for p in ranks.values() if p.node == "node2"]
    t0 = time.monotonic()
    _kill_sshd_with_sessions(sshd_cluster, "node2")
    detected = con.wait_line("err", "mscon: node2: lost:", 10) - t0
    node1_gone = _gone_after(node1, t0, timeout=10.0)
    node2_gone = _gone_after(node2, t0, timeout=15.0)  # its agent saw stdin close and stopped them
    rc = con.finish()
    sshd_cluster.stop_node("node2")  # reap the killed listener
    _report(
        "node2's sshd and sessions killed (keepalive 1 s)",
        noticed=detected,
        node1_ranks_gone=node1_gone,
        node2_ranks_gone=node2_gone,
    )
    assert detected < 2 * keepalive_s
    assert node1_gone is not None and node1_gone < 3.0
    assert node2_gone is not None
    assert rc == 4, con.text("err")[-3000:]
    root = _summary(tmp_path)["root_cause"]
    assert (root["kind"], root["node"], root["code"]) == ("node lost", "node2", 4)
    assert "lost the node node2" in _root_cause_line(con.text("err"))
    _assert_nothing_left(run_id, list(ranks.values()) + agents, sshd_cluster)


# ------------------------------------------------------------------ 6. a network partition


@pytest.fixture
def netns_node(tmp_path: Path, sshd_cluster: SshdCluster) -> Iterable[NetnsNode]:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no network partition test: {reason}")
    node = start_netns_node(tmp_path / "netns", sshd_cluster.client_key, name="nsnode")
    try:
        yield node
    finally:
        node.stop()


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""  # gone meanwhile


def test_partitioned_node_is_lost_within_two_keepalives(
    tmp_path: Path, sshd_cluster: SshdCluster, netns_node: NetnsNode, request: pytest.FixtureRequest
) -> None:
    keepalive_s = 1
    known = write_known_hosts(tmp_path / "known_hosts", sshd_cluster.nodes[:1])
    known.write_text(known.read_text() + netns_node.known_hosts_line + "\n")
    loop = sshd_cluster.nodes[0]
    nodes = [
        {"host": loop.host, "name": loop.name, "devices": 2},
        {"host": netns_node.host, "name": netns_node.name, "devices": 2, "port": netns_node.port},
    ]
    inv = _inventory(
        tmp_path,
        sshd_cluster,
        2,
        ENDLESS,
        nodes=nodes,
        ssh={"keepalive_s": keepalive_s, "known_hosts": str(known)},
    )
    run_id = _run_id("partition")
    # Preflight rightly finds that nsnode cannot reach the scheduler at 127.0.0.2 (its own loopback
    # inside the namespace); the fake ranks never dial it, and the partition is what is tested here.
    con = _start(tmp_path, inv, run_id, "--skip-check", "mesh", "--skip-check", "sched")
    request.addfinalizer(con.kill)
    con.wait_line("out", "[nsnode r3] epoch: 1 step: 3,")
    ranks = _ranks(run_id, 4)
    agents = _agents(ranks.values())
    node1 = [p for p in ranks.values() if p.node == "node1"]
    cut_off = [p for p in ranks.values() if p.node == "nsnode"]
    assert set(netns_node.pids()) >= {p.pid for p in cut_off}  # they do run inside the namespace
    t0 = time.monotonic()
    netns_node.partition()
    detected = con.wait_line("err", "mscon: nsnode: lost:", 10) - t0
    node1_gone = _gone_after(node1, t0, timeout=10.0)
    rc = con.finish()
    exited = time.monotonic() - t0
    node1_agent = [a for a in agents if a.pid in {p.agent_pid for p in node1}]
    assert wait_gone(node1 + node1_agent, 5) == []  # the reachable node: at once
    # The cut-off node cannot be told anything, and its sshd does not drop a busy session
    # (OpenSSH 9.2's ClientAlive probes only fire while it is idle): the agent's own watchdog
    # (no ping from the console for max(5, 3 x keepalive + 2) s) stops its ranks, partition or not.
    watchdog_s = max(5.0, 3 * keepalive_s + 2)
    cut_off_gone = _gone_after(cut_off, t0, timeout=watchdog_s + 5, poll_s=0.05)
    netns_node.heal()
    _report(
        "nsnode partitioned (keepalive 1 s)",
        noticed=detected,
        node1_ranks_gone=node1_gone,
        mscon_exited=exited,
        nsnode_ranks_gone_by_their_watchdog=cut_off_gone,
    )
    assert detected < 2 * keepalive_s + 1
    assert node1_gone is not None and node1_gone < detected + 2
    assert rc == 4, con.text("err")[-3000:]
    root = _summary(tmp_path)["root_cause"]
    assert (root["kind"], root["node"], root["code"]) == ("node lost", "nsnode", 4)
    assert "lost the node nsnode" in _root_cause_line(con.text("err"))
    assert cut_off_gone is not None and cut_off_gone < watchdog_s + 3, cut_off_gone
    _assert_nothing_left(run_id, list(ranks.values()) + agents, sshd_cluster)

    # What may linger is sshd's own session process, until TCP notices the console closed the
    # connection during the partition (a retransmission after the heal): nothing of ours.
    def only_sshd_lingers() -> bool:
        left = [p for p in netns_node.pids() if netns_node.proc is None or p != netns_node.proc.pid]
        assert all(_name(p) in ("sshd", "") for p in left), left
        return not left

    wait_for(only_sshd_lingers, 60, "the node's last sshd session process to go")


# ------------------------------------------------------------------ 7. Ctrl-C


def test_ctrl_c_stops_every_agent_within_200ms(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    inv = _inventory(tmp_path, sshd_cluster, 2, ENDLESS)
    run_id = _run_id("ctrlc")
    con = _start(tmp_path, inv, run_id, "--events", tmp_path / "events.jsonl")
    request.addfinalizer(con.kill)
    con.wait_line("out", "[node2 r3] epoch: 1 step: 3,")
    ranks = _ranks(run_id, 4)
    agents = _agents(ranks.values())
    t0, sent_ns = time.monotonic(), time.time_ns()
    con.proc.send_signal(signal.SIGINT)
    detected = con.wait_line("err", "mscon: stopping every rank on every node: interrupted (Ctrl-C)", 10) - t0
    rc = con.finish()
    exited = time.monotonic() - t0
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    # The agents stamp each rank's exit with their clock (this machine's): the time from the
    # SIGINT to the last rank's exit bounds the time the Stop took to reach every agent.
    exits = {
        (e["msg"]["node"], e["msg"]["name"]): e["msg"]
        for e in events
        if e["kind"] == "agent" and e["msg"]["type"] == "proc_exited" and e["msg"]["rank"] >= 0
    }
    after = {f"{node} {name}": (m["ts_ns"] - sent_ns) / 1e9 for (node, name), m in exits.items()}
    _report("Ctrl-C", noticed=detected, last_rank_exit=max(after.values()), mscon_exited=exited)
    assert rc == 130, con.text("err")[-3000:]
    assert sorted(after) == ["node1 r0", "node1 r1", "node2 r2", "node2 r3"], after
    assert all(m["stopped_by_agent"] for m in exits.values())
    assert all(0 < dt < 0.2 for dt in after.values()), after
    assert [e["reason"] for e in events if e["kind"] == "stopping"] == ["interrupted (Ctrl-C)"]
    s = _summary(tmp_path)
    assert s["status"] == "interrupted" and s["exit_code"] == 130
    _assert_nothing_left(run_id, list(ranks.values()) + agents, sshd_cluster)


# ------------------------------------------------------------------ 8. stdout that nobody reads


def test_blocked_stdout_does_not_hold_up_sigterm(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    args = ENDLESS + ["--lines-per-step", "10"]
    inv = _inventory(tmp_path, sshd_cluster, 2, args)
    run_id = _run_id("blocked")
    con = _start(tmp_path, inv, run_id, read_stdout=False)  # the pipe fills and stays full
    request.addfinalizer(con.kill)
    ranks = _ranks(run_id, 4)
    agents = _agents(ranks.values())
    assert con.proc.stdout is not None
    out = con.proc.stdout.fileno()  # 48 of 64 KiB: the rest is a torn page
    wait_for(
        lambda: pipe_bytes(out) >= 48 * 1024 or (pipe_bytes(out) > 0 and _in_pipe_write(con.proc.pid)),
        30,
        "the console's stdout pipe to fill",
    )
    # Rank output keeps arriving behind the full pipe: every rank writes 4 KiB more (a dozen steps).
    logs = [
        Path(layout.log_file(os.path.dirname(p.environ()["MSCON_METRICS"]), name))
        for name, p in ranks.items()
    ]
    sizes = [log.stat().st_size + 4096 for log in logs]
    wait_for(
        lambda: all(log.stat().st_size >= size for log, size in zip(logs, sizes, strict=True)),
        30,
        "4 KiB more of every rank's output after the console's stdout filled",
    )
    t0 = time.monotonic()
    con.proc.send_signal(signal.SIGTERM)
    detected = con.wait_line("err", "mscon: stopping every rank on every node: terminated (SIGTERM)", 10) - t0
    rc = con.proc.wait(timeout=30)
    exited = time.monotonic() - t0
    con.wait_line("err", "exit code: 130", 5)
    _report("SIGTERM with stdout blocked", noticed=detected, mscon_exited=exited)
    assert rc == 130, con.text("err")[-3000:]
    assert detected < 0.5
    _assert_nothing_left(run_id, list(ranks.values()) + agents, sshd_cluster)
    assert exited < 3.0, (
        f"mscon took {exited:.1f} s to exit after SIGTERM; stderr:\n{con.text('err')[-1500:]}"
    )


def _in_pipe_write(pid: int) -> bool:
    """A thread of ``pid`` waits in the kernel to write to a full pipe (the console's stdout
    writer). A pipe is full by its 16 pages, not its bytes: writes that do not fit a page's rest
    fill it with less than 48 KiB."""
    for wchan in Path(f"/proc/{pid}/task").glob("*/wchan"):
        try:
            if "pipe_write" in wchan.read_text():
                return True
        except OSError:
            continue  # a thread that ended
    return False


# ------------------------------------------------------------------ 9. stdout closed (| head -1)


def test_closed_stdout_ends_the_run_cleanly(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    inv = _inventory(tmp_path, sshd_cluster, 2, ENDLESS)
    run_id = _run_id("head")
    runs, err_txt, rc_txt, out_txt = (
        tmp_path / "runs",
        tmp_path / "err.txt",
        tmp_path / "rc.txt",
        tmp_path / "out.txt",
    )
    cmd = (
        f"{shlex.quote(sys.executable)} -m mscon.console.cli run --no-tui {shlex.quote(str(inv))} "
        f"--run-id {run_id} --logs-dir {shlex.quote(str(runs))} "
        f"--json {shlex.quote(str(tmp_path / 's.json'))} "
        f"2>{shlex.quote(str(err_txt))} | head -1 >{shlex.quote(str(out_txt))}; "
        f"echo ${{PIPESTATUS[0]}} >{shlex.quote(str(rc_txt))}"
    )
    t0 = time.monotonic()
    subprocess.run(["bash", "-c", cmd], cwd=tmp_path, timeout=120, check=True)
    took = time.monotonic() - t0
    rc = int(rc_txt.read_text())
    err = err_txt.read_text()
    _report("stdout closed by head -1", whole_run=took)
    assert rc in (141, 130), err[-3000:]
    assert re.fullmatch(r"\[node\d (r\d|sched)\] .*\n", out_txt.read_text()), out_txt.read_text()
    assert "Traceback" not in err and "Exception" not in err, err
    summary_at = err.index(f"\nmscon: run {run_id} interrupted")
    notes = err[:summary_at].splitlines()
    closed = [line for line in notes if re.search(r"(output|stdout) closed", line)]
    # One line says why the run stopped; the count of rank lines not shown may follow (once).
    assert closed[0] == "mscon: stopping every rank on every node: output closed (stdout)", closed
    assert len(closed) <= 2 and all("line(s) of rank output not shown" in line for line in closed[1:]), closed
    assert re.search(rf"^mscon: run {run_id} interrupted in [0-9.]+ s: output closed", err, re.M), err
    assert f"exit code: {rc}" in err
    s = _summary(tmp_path)
    workers = [r for r in s["ranks"] if r["rank"] >= 0]
    assert len(workers) == 4 and all(r["status"].startswith("stopped") for r in workers), workers
    assert run_processes(run_id) == []
    nothing_under_sshd(sshd_cluster)
    fetched = sorted(
        p.relative_to(runs / run_id).as_posix()
        for p in (runs / run_id).glob(layout.log_path("node*", 0, "r*"))
    )
    assert fetched == [layout.log_path(f"node{n}", 0, f"r{r}") for n, r in ((1, 0), (1, 1), (2, 2), (2, 3))]


def nothing_under_sshd(cluster: SshdCluster, timeout: float = 10) -> None:
    """Wait until no process is left below the nodes' sshd; fail naming what is."""

    def left() -> list[list[str]]:
        return [psutil.Process(p).cmdline() for p in _under_sshd(cluster) if pid_alive(p)]

    wait_for(lambda: not _under_sshd(cluster), timeout, "nothing left under the nodes' sshd", left)


# ------------------------------------------------------------------ 10. DNS name + ssh alias, MindSpore


@pytest.fixture
def dns_name() -> Iterable[str]:
    """A name that only /etc/hosts knows, for 127.0.0.2 (node1 of sshd_cluster); removed afterwards."""
    name = f"mscon-dns-{secrets.token_hex(2)}.test"
    line = f"127.0.0.2 {name}  # mscon test_faults, temporary\n"
    hosts = Path("/etc/hosts")
    try:
        with hosts.open("a") as f:
            f.write(line)
    except OSError as exc:
        pytest.skip(f"cannot add a temporary name to /etc/hosts: {exc}")
    try:
        yield name
    finally:  # remove only our line: another test may have touched the file meanwhile
        text = hosts.read_text()
        hosts.write_text("".join(x for x in text.splitlines(keepends=True) if x != line))


@pytest.mark.mindspore  # 2 nodes x 1: the names, not the topology, are the point
@needs_mindspore
def test_real_mindspore_via_dns_name_and_ssh_config_alias(
    tmp_path: Path, sshd_cluster: SshdCluster, dns_name: str
) -> None:
    node1, node2 = sshd_cluster.nodes
    config = tmp_path / "ssh_config"
    config.write_text(
        "".join(
            f"Host {alias}\n  HostName {n.host}\n  Port {n.port}\n  User root\n"
            f"  IdentityFile {sshd_cluster.client_key}\n"
            for alias, n in (("node-a", node1), ("node-b", node2))
        )
    )
    # OpenSSH records a name's key under the name; the IP entries stay for the alias (HostName).
    known = write_known_hosts(tmp_path / "known_hosts", sshd_cluster.nodes)
    key = node1.known_hosts_line.split(" ", 1)[1]
    known.write_text(known.read_text() + f"[{dns_name}]:{node1.port} {key}\n")
    nodes = [
        {
            "host": dns_name,
            "devices": 1,
            "port": node1.port,
            "user": "root",
            "identity_file": str(sshd_cluster.client_key),
        },
        {"host": "node-b", "devices": 1},  # port, user and key from the ssh config
    ]
    args = ["--parallel-mode", "data_parallel", "--epochs", "1", "--steps-per-epoch", "10"]
    inv = _inventory(
        tmp_path,
        sshd_cluster,
        1,
        args,
        script=TRAIN,
        nodes=nodes,
        ssh={"config": str(config), "known_hosts": str(known)},
    )
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"] = {"python": sys.executable}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    run_id = _run_id("names")
    t0 = time.monotonic()
    done = mscon(
        "run", "--no-tui", inv, "--run-id", run_id, "--json", tmp_path / "s.json", cwd=tmp_path, timeout=300
    )
    _report("2x1 MindSpore, DNS name + ssh-config alias", whole_run=time.monotonic() - t0)
    assert done.code == 0, done.err[-4000:]
    for node, rank in ((dns_name, 0), ("node-b", 1)):
        steps = re.findall(rf"^\[{re.escape(node)} r{rank}\] epoch: 1 step: (\d+), loss is", done.out, re.M)
        assert [int(s) for s in steps] == list(range(1, 11)), (node, rank, steps)
    workers = [r for r in _summary(tmp_path)["ranks"] if r["rank"] >= 0]
    assert sorted((r["node"], r["rank"]) for r in workers) == [(dns_name, 0), ("node-b", 1)]
    assert all(r["status"] == "ok" and r["last_step"] == 10 for r in workers), workers
    assert run_processes(run_id) == []
    nothing_under_sshd(sshd_cluster)


# ------------------------------------------------------------------ 11. restart from the checkpoint


@pytest.mark.mindspore
@needs_mindspore
def test_max_restarts_resumes_from_checkpoint(
    tmp_path: Path, sshd_cluster: SshdCluster, request: pytest.FixtureRequest
) -> None:
    args = [
        "--parallel-mode", "data_parallel", "--epochs", "1", "--steps-per-epoch", "16",
        "--die-at-step", "10", "--die-rank", "1", "--checkpoint-every", "4",
    ]  # fmt: skip
    node1 = sshd_cluster.nodes[0]
    inv = _inventory(
        tmp_path,
        sshd_cluster,
        2,
        args,
        script=TRAIN,
        nodes=[{"host": node1.host, "name": node1.name, "devices": 2}],
        restart={"backoff_s": 0.5},
    )
    run_id = _run_id("restart")
    con = _start(tmp_path, inv, run_id, "--max-restarts", "1")
    request.addfinalizer(con.kill)
    died = con.wait_line("out", "[node1 r1] mscon-trainer: --die-at-step 10: rank 1 kills itself", 240)
    noticed = con.wait_line("err", "mscon: r1 on node1 failed: killed by SIGKILL", 10)
    # From the per-step snapshot in node memory (mscon passes --snapshot-every 1), not the step-8
    # checkpoint: no step is lost.
    resumed = con.wait_line("out", "[node1 r0] mscon-trainer: resumed from step 10 (snapshot", 240)
    rc = con.finish(240)
    _report(
        "--max-restarts 1, r1 killed at step 10",
        noticed_after_its_last_line=noticed - died,
        resumed_after_the_notice=resumed - noticed,
    )
    assert rc == 0, con.text("err")[-4000:]
    assert noticed - died < 1.0
    err = con.text("err")
    # At once: the ranks had stepped (restart.backoff_s is for failures in start-up).
    assert "mscon: restarting the whole group as attempt 1 in 0 s" in err
    s = _summary(tmp_path)
    assert s["status"] == "succeeded" and s["exit_code"] == 0
    a0, a1 = s["attempts"]
    assert (a0["attempt"], a0["outcome"], a1["attempt"], a1["outcome"]) == (0, "failed", 1, "succeeded")
    assert (a0["root_cause"]["name"], a0["root_cause"]["kind"], a0["root_cause"]["signal"]) == (
        "r1",
        "signal",
        "SIGKILL",
    )
    assert a1["root_cause"] is None
    logs = tmp_path / "runs" / run_id / "node1"
    for attempt in (0, 1):
        for name in ("r0", "r1", "sched"):
            assert Path(layout.log_path(logs, attempt, name)).is_file(), (attempt, name)
    first_try = Path(layout.log_path(logs, 0, "r1")).read_text()
    assert "--die-at-step 10: rank 1 kills itself" in first_try
    second_try = Path(layout.log_path(logs, 1, "r0")).read_text()
    steps = [int(x) for x in re.findall(r"^epoch: 1 step: (\d+), loss is", second_try, re.M)]
    assert steps == list(range(11, 17)), steps  # after the step-10 snapshot, to the end
    assert "resumed from step 10 (snapshot" in second_try
    workers = [r for r in s["ranks"] if r["rank"] >= 0]
    assert all(r["status"] == "ok" and r["last_step"] == 16 for r in workers), workers
    assert run_processes(run_id) == []
    nothing_under_sshd(sshd_cluster)
