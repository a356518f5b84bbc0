"""Detach and attach over real sshd nodes: runs that outlive their console.

Each test starts two real OpenSSH servers (127.0.0.2, 127.0.0.3), runs `mscon run --detach`, lets
the console process end, and checks what goes on without it (ranks training, the node-0
coordinator's stop and restart) and what `mscon attach / ls / logs / stop` see afterwards.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import (
    TRAINER,
    agent_processes,
    kill_run,
    mscon,
    mscon_popen,
    needs_mindspore,
    node_run_dir,
    run_processes,
    ssh_inventory,
    use_ssh_config_aliases,
    wait_gone,
)
from mscon.agent import layout
from sshd_nodes import SshdCluster

FAKE = "bench/fake_rank.py"


def _inventory(
    tmp_path: Path, cluster: SshdCluster, args: list[str], script: str = FAKE, **top: dict
) -> Path:
    inv = ssh_inventory(tmp_path / "inv.yaml", cluster, 1, script, args)
    doc = yaml.safe_load(inv.read_text())
    for key, value in top.items():
        doc[key] = {**doc.get(key, {}), **value}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


_STARTED: list[str] = []


@pytest.fixture(autouse=True)
def _no_run_left_behind() -> Iterator[None]:
    yield
    while _STARTED:  # a test that failed half-way must not leave a detached run training
        kill_run(_STARTED.pop())


def _run_id(kind: str) -> str:
    # Node folders live in the (shared) home folder: a reused id would meet an earlier run's logs.
    run_id = f"{kind}-{secrets.token_hex(3)}"
    _STARTED.append(run_id)
    return run_id


def _detach(tmp_path: Path, inv: Path, run_id: str) -> None:
    done = mscon(
        "run", "--no-tui", "--detach", "--no-check", inv, "--run-id", run_id, cwd=tmp_path, timeout=60
    )
    assert done.code == 0, done.err
    assert f"mscon attach {run_id}" in done.err


def _rank_lines(out: str, rank: int) -> list[str]:
    return re.findall(rf"^\[node\d r{rank}\] (.*)$", out, re.M)


def _wait(pred, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class _Output:
    """A console's stdout and stderr, read as they come (a thread each), so a test can wait on what
    it has printed so far."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((proc.stdout, self.out), (proc.stderr, self.err))
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:  # noqa: ANN001
        for line in stream:
            lines.append(line)

    def finish(self, timeout: float) -> tuple[str, str]:
        """Wait for the console to exit and its output to end; both outputs, whole."""
        self.proc.wait(timeout)
        for t in self._threads:
            t.join(timeout)
        return "".join(self.out), "".join(self.err)


def _log_has(run_id: str, node: str, name: str, text: str = "") -> bool:
    """The node's log of ``name`` (attempt 0) holds a line containing ``text`` (any line for "")."""
    try:
        with open(layout.log_path(node_run_dir(run_id, node), 0, name), encoding="utf-8") as f:
            return any(text in line for line in f)
    except OSError:
        return False


def _node_state(run_id: str, node: str) -> dict:
    try:
        return json.loads(Path(layout.state_file(str(node_run_dir(run_id, node)))).read_text())
    except (OSError, ValueError):
        return {}


@needs_mindspore
def test_detached_run_trains_on_and_attach_shows_every_line_once(
    tmp_path: Path, sshd_cluster: SshdCluster
) -> None:
    """The real trainer on two nodes: detach, the console is gone, the ranks train on; an attach
    prints some lines and leaves (Ctrl-C), a second attach follows the run to its end. Every
    rank's log line is printed exactly once, in order, across the three consoles, and matches the
    fetched log."""
    # --step-sleep: 400 steps take 8 s or more, however idle the machine, so the first console
    # leaves while the run trains on and the second one has steps left to print.
    args = ["--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--steps-per-epoch", "400"]
    args += ["--step-sleep", "0.02"]
    inv = _inventory(tmp_path, sshd_cluster, args, script=str(TRAINER.relative_to(TRAINER.parents[1])))
    run_id = _run_id("detach-train")
    _detach(tmp_path, inv, run_id)
    # The console is gone; the ranks (and their agents, now daemons) are not.
    _wait(lambda: len(run_processes(run_id)) >= 3, 30, "the ranks")
    first = _Output(mscon_popen("attach", run_id, "--no-tui", cwd=tmp_path))
    _wait(lambda: (tmp_path / layout.LOGS_DIR / run_id / "detached.json").exists(), 30, "the record")
    _wait(
        lambda: sum("loss" in line for line in _rank_lines("".join(first.out), 0)) >= 5,
        120,
        "training steps printed by the first console",
    )
    first.proc.send_signal(signal.SIGINT)
    out1, err1 = first.finish(30)
    assert first.proc.returncode == 0, err1
    assert "the run goes on" in err1
    assert run_processes(run_id), "leaving an attached run must not stop it"
    second = mscon("attach", run_id, "--no-tui", cwd=tmp_path, timeout=240)
    assert second.code == 0, second.err
    assert "succeeded" in second.err
    logs = tmp_path / layout.LOGS_DIR / run_id
    for rank, node in ((0, "node1"), (1, "node2")):
        printed = _rank_lines(out1, rank) + _rank_lines(second.out, rank)
        fetched = Path(layout.log_path(logs / node, 0, f"r{rank}")).read_text().splitlines()
        assert printed == fetched, f"r{rank}: {len(printed)} printed vs {len(fetched)} in the log"
    assert any("loss" in line for line in _rank_lines(out1, 0)), "the first attach printed no step"
    assert any("loss" in line for line in _rank_lines(second.out, 0)), "the second attach printed no step"
    assert run_processes(run_id) == []


@needs_mindspore
def test_killed_rank_is_stopped_by_the_coordinator_and_attach_names_it(
    tmp_path: Path, sshd_cluster: SshdCluster
) -> None:
    """Real MindSpore ranks, no console: r1 is killed with SIGKILL mid-training. Without a console
    r0 would wait in its collective for a minute or more; node1's coordinator stops it (and the
    scheduler) at once, and a later attach names r1 as the root cause."""
    args = ["--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--steps-per-epoch", "2000"]
    inv = _inventory(tmp_path, sshd_cluster, args, script=str(TRAINER.relative_to(TRAINER.parents[1])))
    run_id = _run_id("detach-kill")
    _detach(tmp_path, inv, run_id)
    _wait(lambda: _log_has(run_id, "node2", "r1", "loss"), 120, "training steps")
    r1_metrics = "/r1" + layout.METRICS_SUFFIX
    victim = next(p for p in run_processes(run_id) if p.environ()["MSCON_METRICS"].endswith(r1_metrics))
    others = [p for p in run_processes(run_id) if p.pid != victim.pid]
    assert others, "r0 and the scheduler run on node1"
    victim.kill()
    t0 = time.monotonic()
    assert wait_gone(others, 15) == [], "the coordinator stops the survivors"
    stopped_in = time.monotonic() - t0
    done = mscon("attach", run_id, "--no-tui", "--json", tmp_path / "s.json", cwd=tmp_path, timeout=60)
    assert done.code == 137, done.err
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["status"] == "failed"
    assert s["root_cause"]["name"] == "r1" and s["root_cause"]["signal"] == "SIGKILL"
    assert "r1 on node2" in done.err and "SIGKILL" in done.err
    roles = {r["name"]: r["role"] for r in s["ranks"]}
    assert roles["r1"] == "root cause" and roles["r0"] == "victim"
    # No restart budget: the run waits for an operator (mscon attach in a terminal, then r); a
    # headless attach reports the failure and leaves it waiting, and mscon stop ends it.
    assert "the run waits for an operator" in done.err and f"mscon stop {run_id}" in done.err
    assert _run_agents(run_id) != []
    stopped = mscon("stop", run_id, "--json", tmp_path / "stop.json", cwd=tmp_path, timeout=60)
    assert stopped.code == 137, stopped.err
    assert json.loads((tmp_path / "stop.json").read_text())["root_cause"]["name"] == "r1"
    assert Path(layout.log_path(tmp_path / layout.LOGS_DIR / run_id / "node2", 0, "r1")).is_file()
    # The run is over: its agents (daemons, no longer under sshd's sessions) have exited too.
    _wait(lambda: _run_agents(run_id) == [], 10, "the run's agents to exit")
    print(f"survivors stopped {stopped_in:.2f} s after the kill, with no console")


def test_lost_follower_ends_the_detached_run_naming_the_node(
    tmp_path: Path, sshd_cluster: SshdCluster
) -> None:
    """node2's agent is killed (its ranks die with it): node1's coordinator loses its link, stops
    node1's ranks, and ends the run (reconnecting a node needs the console); attach names node2."""
    inv = _inventory(tmp_path, sshd_cluster, ["--steps", "3000", "--rate", "20"], restart={"max_restarts": 2})
    run_id = _run_id("detach-lost")
    _detach(tmp_path, inv, run_id)
    _wait(lambda: len(_run_agents(run_id)) == 2, 20, "two daemon agents")
    (victim,) = [a for a in _run_agents(run_id) if a.cwd().endswith("/node2")]
    victim.kill()
    _wait(lambda: run_processes(run_id) == [] and _status(run_id) != "running", 30, "the end of the run")
    assert _status(run_id) == "failed"
    done = mscon("attach", run_id, "--no-tui", "--json", tmp_path / "s.json", cwd=tmp_path, timeout=60)
    assert done.code == 4, done.err
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["root_cause"]["kind"] == "node lost" and s["root_cause"]["node"] == "node2"
    assert len(s["attempts"]) == 1  # no restart: a lost node cannot be reconnected without the console


def test_detached_failure_restarts_the_group_per_policy(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    # MSCON_ATTEMPT: the fake rank fails only in attempt 0 (its --fail-rank applies to every attempt,
    # so the restarted group fails again: the budget of 1 restart is used, then the run ends).
    args = ["--steps", "400", "--rate", "10", "--fail-rank", "0", "--fail-step", "60", "--fail-code", "5"]
    inv = _inventory(tmp_path, sshd_cluster, args, restart={"max_restarts": 1, "backoff_s": 0.5})
    run_id = _run_id("detach-restart")
    _detach(tmp_path, inv, run_id)
    _wait(
        lambda: Path(layout.attempt_folder(node_run_dir(run_id, "node2"), 1)).is_dir(),
        30,
        "the coordinator's restart on node1",
    )
    _wait(lambda: run_processes(run_id) == [] and _waits_for_operator(run_id), 40, "the budget used up")
    done = mscon("attach", run_id, "--no-tui", "--json", tmp_path / "s.json", cwd=tmp_path, timeout=60)
    assert done.code == 5, done.err
    s = json.loads((tmp_path / "s.json").read_text())
    assert [a["attempt"] for a in s["attempts"]] == [0, 1]
    assert all(a["outcome"] == "failed" for a in s["attempts"])
    assert s["root_cause"]["name"] == "r0"
    _end_waiting_run(tmp_path, run_id, 5)


def test_detach_with_nodes_named_by_ssh_config_aliases(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    """Nodes known only as ~/.ssh/config aliases, as users name them: node2's agent reaches node1's
    coordinator at the address the scheduler gets (resolved from the alias's HostName), so with no
    console a failed rank on node2 still stops node1's rank, and attach names it."""
    args = ["--steps", "3000", "--rate", "20", "--fail-rank", "1", "--fail-step", "40", "--fail-code", "7"]
    inv = use_ssh_config_aliases(_inventory(tmp_path, sshd_cluster, args), sshd_cluster)
    run_id = _run_id("detach-alias")
    _detach(tmp_path, inv, run_id)
    # r0 would print for 150 s: only node1's coordinator, told by node2's agent, stops it.
    _wait(lambda: run_processes(run_id) == [] and _waits_for_operator(run_id), 30, "the failure")
    done = mscon("attach", run_id, "--no-tui", "--json", tmp_path / "s.json", cwd=tmp_path, timeout=60)
    assert done.code == 7, done.err
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["root_cause"]["name"] == "r1" and s["root_cause"]["node"] == "node2", s["root_cause"]
    assert {r["name"]: r["role"] for r in s["ranks"]}["r0"] == "victim"
    _end_waiting_run(tmp_path, run_id, 7)
    assert _status(run_id) == "failed"


def _waits_for_operator(run_id: str) -> bool:
    """A detached run with no restart left waits for an operator (agent/policy.py) before it ends."""
    state = _node_state(run_id, "node1")
    return state.get("status") == "running" and "waiting for an operator" in str(state.get("reason", ""))


def _end_waiting_run(tmp_path: Path, run_id: str, code: int) -> None:
    """mscon stop ends a waiting run with its failed attempt's verdict; its agents then exit."""
    stopped = mscon("stop", run_id, cwd=tmp_path, timeout=60)
    assert stopped.code == code, stopped.err
    _wait(lambda: _run_agents(run_id) == [], 15, "the run's agents to exit")


def _run_agents(run_id: str) -> list[psutil.Process]:
    """Agents whose working folder is one of this run's node folders (a detached agent chdirs there)."""
    root = str(node_run_dir(run_id, "node1").parent) + "/"
    found = []
    for p in agent_processes(["node1", "node2"]):
        try:
            if p.cwd().startswith(root):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _status(run_id: str) -> str:
    return str(_node_state(run_id, "node1").get("status", "?"))


def test_ls_logs_follow_second_attach_and_stop(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    inv = _inventory(tmp_path, sshd_cluster, ["--steps", "3000", "--rate", "20"])
    run_id = _run_id("detach-ls")
    _detach(tmp_path, inv, run_id)
    _wait(lambda: len(run_processes(run_id)) >= 2, 20, "the ranks")
    listed = mscon("ls", inv, cwd=tmp_path, timeout=60)
    assert listed.code == 0, listed.err
    row = next(line for line in listed.out.splitlines() if line.startswith(run_id))
    assert row.split()[1] == "running" and "node1,node2" in row
    _wait(lambda: _log_has(run_id, "node2", "r1"), 20, "r1's first line")
    logs = mscon("logs", run_id, inv, "--rank", "1", cwd=tmp_path, timeout=60)
    assert logs.code == 0, logs.err
    lines = logs.out.splitlines()
    assert lines and all(line.startswith("[node2 r1] ") for line in lines), logs.err
    follower = mscon_popen("logs", run_id, inv, "-f", cwd=tmp_path)
    steering = mscon_popen("attach", run_id, "--no-tui", cwd=tmp_path)
    _wait(
        lambda: all(_node_state(run_id, n).get("attached") for n in ("node1", "node2")),
        30,
        "the steering console to hold the run",
    )
    second = mscon("attach", run_id, "--no-tui", cwd=tmp_path, timeout=60)
    assert second.code == 2
    assert "already attached by" in second.err and "one console steers a run at a time" in second.err
    stopped = mscon("stop", run_id, inv, cwd=tmp_path, timeout=60)
    assert stopped.code == 2 and "already attached" in stopped.err  # the steering console holds it
    steering.send_signal(signal.SIGINT)
    steering.communicate(timeout=30)
    stopped = mscon("stop", run_id, inv, "--json", tmp_path / "s.json", cwd=tmp_path, timeout=60)
    assert stopped.code == 130, stopped.err
    assert json.loads((tmp_path / "s.json").read_text())["status"] == "interrupted"
    assert Path(layout.log_path(tmp_path / layout.LOGS_DIR / run_id / "node1", 0, "r0")).is_file()
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    followed = [line for line in out.splitlines() if line.startswith("[node1 r0] ")]
    assert len(followed) > len([line for line in lines if line]) / 2
    assert run_processes(run_id) == []
    listed = mscon("ls", inv, cwd=tmp_path, timeout=60)
    row = next(line for line in listed.out.splitlines() if line.startswith(run_id))
    assert row.split()[1] == "interrupted"


def _other_user() -> str | None:
    name = "mscon-other"
    try:
        pwd.getpwnam(name)
        return name
    except KeyError:
        pass
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return None
    done = subprocess.run(["useradd", "--no-create-home", name], capture_output=True, text=True)
    return name if done.returncode == 0 else None


def test_agent_socket_is_refused_to_another_user(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    other = _other_user()
    system_python = shutil.which("python3", path="/usr/bin:/bin")  # the venv's may not be theirs to run
    if other is None or shutil.which("runuser") is None or system_python is None:
        pytest.skip("needs root, useradd, runuser and /usr/bin/python3 to act as a second local user")
    inv = _inventory(tmp_path, sshd_cluster, ["--steps", "3000", "--rate", "20"])
    run_id = _run_id("detach-user")
    _detach(tmp_path, inv, run_id)
    try:
        run_dir = node_run_dir(run_id, "node1")
        sock = Path(layout.socket_file(str(run_dir)))
        _wait(sock.exists, 10, "the socket")
        assert run_dir.stat().st_mode & 0o777 == 0o700
        assert sock.stat().st_mode & 0o777 == 0o600
        probe = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            "try:\n s.connect(sys.argv[1])\nexcept OSError as e:\n print('refused', e.errno)\n"
            "else:\n s.settimeout(3)\n print('connected', len(s.recv(100)))\n"
        )
        done = subprocess.run(
            ["runuser", "-u", other, "--", system_python, "-c", probe, str(sock)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.stdout.startswith("refused"), done.stdout + done.stderr
        # The owner gets in (a Hello first).
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(sock))
            assert b'"type":"hello"' in s.recv(4096)
    finally:
        mscon("stop", run_id, inv, cwd=tmp_path, timeout=60)
    assert wait_gone(run_processes(run_id), 10) == []


def test_without_detach_a_killed_console_leaves_nothing(tmp_path: Path, sshd_cluster: SshdCluster) -> None:
    inv = _inventory(tmp_path, sshd_cluster, ["--steps", "3000", "--rate", "20"])
    run_id = _run_id("no-detach")
    console = mscon_popen("run", "--no-tui", "--no-check", inv, "--run-id", run_id, cwd=tmp_path)
    _wait(lambda: len(run_processes(run_id)) >= 2, 30, "the ranks")
    ranks = run_processes(run_id)
    console.kill()
    console.communicate(timeout=10)
    assert wait_gone(ranks, 5.0) == [], "every rank stops within 5 s of the console's death"
    assert psutil.pid_exists(sshd_cluster.nodes[0].pid)
