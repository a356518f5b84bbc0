"""``mscon check`` and the checks before ``mscon run``, for real: sshd nodes on 127.0.0.x, real agents,
a real tmpfs, real MindSpore where it matters (the version probe, the AllReduce smoke test)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import local_inventory, mscon, needs_mindspore, ssh_inventory, write_inventory
from mscon.agent import layout
from sshd_nodes import SshdCluster, SshdNode, require_sshd, start_sshd_cluster

FAKE = "bench/fake_rank.py"
TRAIN = "trainer/train.py"
FAKE_ARGS = ["--steps", "2", "--rate", "0"]


# ------------------------------------------------------------------ helpers


def reconfigure_sshd(cluster: SshdCluster, node: SshdNode, edit: Callable[[str], str]) -> SshdNode:
    """One node's sshd with an edited config (sshd_nodes.py writes the standard one): the test's own
    variations, e.g. without the SFTP subsystem or with SetEnv."""
    node.config.write_text(edit(node.config.read_text()))
    return cluster.restart_node(node)


def without_sftp(text: str) -> str:
    lines = [line for line in text.splitlines() if not line.startswith("Subsystem ")]
    assert len(lines) < len(text.splitlines()), "the standard config has a Subsystem line"
    return "\n".join(lines) + "\n"


def with_setenv(assignment: str) -> Callable[[str], str]:
    return lambda text: text + f"SetEnv {assignment}\n"


def edit_inventory(path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    return write_inventory(path, doc)


def results(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    doc = json.loads(path.read_text())
    return {(r["node"], r["name"]): r for r in doc["results"]}


@contextlib.contextmanager
def hold_port(port: int, host: str = "0.0.0.0") -> Iterator[socket.socket]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(1)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def cluster2(tmp_path: Path) -> Iterator[SshdCluster]:
    require_sshd()
    cluster = start_sshd_cluster(tmp_path / "sshd", n=2)
    try:
        yield cluster
    finally:
        cluster.stop()


# ------------------------------------------------------------------ everything passes, with a real AllReduce


@pytest.mark.ssh
@pytest.mark.mindspore
@needs_mindspore
def test_check_two_ssh_nodes_passes_with_a_real_allreduce(tmp_path: Path, cluster2: SshdCluster) -> None:
    args = ["--parallel-mode", "data_parallel", "--epochs", "1", "--batch-size", "32"]
    inv = ssh_inventory(tmp_path / "inv.yaml", cluster2, 1, TRAIN, args)
    t0 = time.monotonic()
    done = mscon(
        "check",
        inv,
        "--sweep",
        "--json",
        tmp_path / "c.json",
        "--events",
        tmp_path / "ev.jsonl",
        cwd=tmp_path,
    )
    wall = time.monotonic() - t0
    assert done.code == 0, done.out + done.err[-3000:]
    header = done.out.splitlines()[0].split()
    assert header[:3] == ["node", "protocol", "python"] and "mindspore" in header
    assert any(line.startswith("node1 ") for line in done.out.splitlines())
    found = results(tmp_path / "c.json")
    for node in ("node1", "node2"):
        assert found[(node, "mindspore")]["status"] == "ok"
        assert found[(node, "protocol")]["status"] == "ok"
        assert found[(node, "clock")]["status"] == "ok"
    assert found[("node1", "port")]["status"] == "ok" and found[("node2", "port")]["status"] == "n/a"
    cluster_wide = {name: r for (node, name), r in found.items() if node == "*"}
    assert cluster_wide["mindspore"]["value"].endswith("on every node")
    assert cluster_wide["mesh"]["value"].startswith("2 x 2 connected")
    assert (
        cluster_wide["sched"]["value"] == f"127.0.0.2:{yaml.safe_load(inv.read_text())['scheduler']['port']}"
    )
    assert cluster_wide["config"]["status"] == "ok"
    assert cluster_wide["clock"]["status"] == "ok"
    collective = cluster_wide["collective"]
    assert collective["status"] == "ok" and "AllReduce on 2 ranks: sum 3 ok" in collective["value"]
    # --sweep on CPU: bus bandwidth from 1 KiB to 1 MiB, measured for real over MCCL between the nodes.
    busbw = cluster_wide["collective.busbw"]
    assert busbw["status"] == "ok" and "GB/s bus bandwidth at" in busbw["value"], busbw
    sizes = [part.split(" GB/s")[0].rsplit(" ", 1)[0] for part in busbw["detail"].split("; ")]
    assert sizes == ["1 KiB", "4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB"], busbw["detail"]
    assert "hardware" not in busbw["detail"]  # the untested-on-devices note is for GPU/Ascend only
    assert not list(tmp_path.glob(f"{layout.LOGS_DIR}/*-smoke"))  # a passing smoke test keeps no logs
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert kinds.count("checks_finished") == 1 and kinds.count("check") == len(found)
    print(f"\nmscon check, 2 sshd nodes x 1 rank, with the AllReduce: {wall:.1f} s")


@pytest.mark.mindspore(ranks=4)
@needs_mindspore
def test_collective_smoke_test_on_four_local_ranks(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 4, FAKE, FAKE_ARGS)
    # Skipping the MindSpore probe keeps this at 4 ranks + the scheduler of MindSpore at once.
    done = mscon(
        "check", inv, "--skip-check", "mindspore", "--json", tmp_path / "c.json", cwd=tmp_path, timeout=400
    )
    assert done.code == 0, done.out + done.err[-3000:]
    collective = results(tmp_path / "c.json")[("*", "collective")]
    assert "AllReduce on 4 ranks: sum 10 ok" in collective["value"], collective
    assert "skipped (--skip-check): mindspore" in done.err


# ------------------------------------------------------------------ one check fails


@pytest.mark.ssh
def test_a_port_held_open_fails_with_exit_3(tmp_path: Path, cluster2: SshdCluster) -> None:
    inv = ssh_inventory(tmp_path / "inv.yaml", cluster2, 1, FAKE, FAKE_ARGS)
    port = yaml.safe_load(inv.read_text())["scheduler"]["port"]
    with hold_port(port):
        t0 = time.monotonic()
        done = mscon("check", "--quick", inv, "--json", tmp_path / "c.json", cwd=tmp_path)
        wall = time.monotonic() - t0
    assert done.code == 3, done.out + done.err
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["failed"] == ["node1: port"] and doc["exit_code"] == 3
    port_result = results(tmp_path / "c.json")[("node1", "port")]
    assert f"{port} in use by pid {os.getpid()}" in port_result["value"]
    assert "scheduler.port" in port_result["remedy"]
    assert "FAIL node1: port:" in done.out and "-> choose another scheduler.port" in done.out
    assert wall < 15, wall  # the quick checks of 2 nodes, connections included


@pytest.mark.ssh
def test_run_refuses_to_launch_on_a_fail_and_skip_check_launches(
    tmp_path: Path, cluster2: SshdCluster
) -> None:
    inv = ssh_inventory(tmp_path / "inv.yaml", cluster2, 1, FAKE, FAKE_ARGS)
    port = yaml.safe_load(inv.read_text())["scheduler"]["port"]
    with hold_port(port):
        refused = mscon("run", "--no-tui", inv, "--logs-dir", tmp_path / "runs", cwd=tmp_path)
        assert refused.code == 3, refused.err
        assert "fake rank" not in refused.out  # nothing was launched
        assert "not launching" in refused.err and "preflight failed: node1: port" in refused.err
        launched = mscon(
            "run", "--no-tui", inv, "--skip-check", "port", "--logs-dir", tmp_path / "runs",
            "--json", tmp_path / "s.json", "--events", tmp_path / "ev.jsonl", cwd=tmp_path,
        )  # fmt: skip
    assert launched.code == 0, launched.err
    assert "fake rank 0 of 2 starting" in launched.out
    assert "skipped (--skip-check): port" in launched.err
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["preflight"]["skipped"] == ["port"] and summary["preflight"]["fail"] == 0
    on_disk = json.loads((Path(summary["logs_dir"]) / "summary.json").read_text())
    assert on_disk["preflight"]["skipped"] == ["port"]
    finished = [
        json.loads(line)
        for line in (tmp_path / "ev.jsonl").read_text().splitlines()
        if '"checks_finished"' in line
    ]
    assert [f["skipped"] for f in finished] == [["port"]]
    nocheck = mscon("run", "--no-tui", "-q", inv, "--no-check", "--logs-dir", tmp_path / "runs", cwd=tmp_path)
    assert nocheck.code == 0 and "preflight" not in nocheck.err


@pytest.mark.ssh
def test_shared_memory_too_small_on_a_tmpfs(tmp_path: Path, cluster2: SshdCluster) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(shm)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        inv = ssh_inventory(tmp_path / "inv.yaml", cluster2, 1, FAKE, FAKE_ARGS)
        edit_inventory(inv, lambda d: d.update(checks={"shm_min_gib": 0.5}))
        env = {**os.environ, "MSCON_SHM_PATH": str(shm)}
        done = mscon("check", "--quick", inv, "--json", tmp_path / "c.json", cwd=tmp_path, env=env)
    finally:
        subprocess.run(["umount", str(shm)], check=False)
    assert done.code == 3, done.out + done.err
    found = results(tmp_path / "c.json")
    for node in ("node1", "node2"):
        r = found[(node, "shm")]
        assert r["status"] == "fail" and r["value"] == "16 MiB free of 16 MiB", r
        assert "--shm-size" in r["remedy"] and "shm_min_gib 0.5" in r["detail"]


# ------------------------------------------------------------------ a cluster with one problem per node


@pytest.fixture(scope="module")
def broken_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, dict[tuple[str, str], dict]]]:
    """node1: a leftover MS_ROLE in its sshd's environment (SetEnv); node2: a fake MindSpore 2.9.0
    first on its PYTHONPATH; node3: a Python without MindSpore and a GLOO_SOCKET_IFNAME that names no
    interface. One full check (no collective) of all three."""
    require_sshd()
    tmp = tmp_path_factory.mktemp("broken")
    cluster = start_sshd_cluster(tmp / "sshd", n=3)
    try:
        reconfigure_sshd(cluster, cluster.nodes[0], with_setenv("MS_ROLE=MS_WORKER"))
        fake = tmp / "fake-ms" / "mindspore"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text('__version__ = "2.9.0"\n')
        inv = ssh_inventory(tmp / "inv.yaml", cluster, 1, FAKE, FAKE_ARGS)

        def broken(doc: dict[str, Any]) -> None:
            doc["nodes"][1]["env"] = {"PYTHONPATH": str(fake.parent)}
            doc["nodes"][2]["python"] = "/usr/bin/python3"
            doc["nodes"][2]["env"] = {"GLOO_SOCKET_IFNAME": "nosuch0"}

        edit_inventory(inv, broken)
        done = mscon("check", "--no-collective", inv, "--json", tmp / "c.json", cwd=tmp, timeout=300)
        yield done, results(tmp / "c.json")
    finally:
        cluster.stop()


@pytest.mark.ssh
@needs_mindspore
def test_broken_cluster_exits_3_with_a_remedy_for_each(broken_cluster: tuple[Any, dict]) -> None:
    done, _ = broken_cluster
    assert done.code == 3, done.out + done.err
    fixes = done.out.split("to fix:")[1]
    assert "FAIL all nodes: mindspore: differ:" in fixes and "WARN node1: env.leftover: MS_ROLE" in fixes


@pytest.mark.ssh
@needs_mindspore
def test_mindspore_version_mismatch_names_both_versions(broken_cluster: tuple[Any, dict]) -> None:
    _, found = broken_cluster
    assert found[("node1", "mindspore")]["value"] == "2.10.0"
    assert found[("node2", "mindspore")]["value"] == "2.9.0"
    skew = found[("*", "mindspore")]
    assert skew["status"] == "fail"
    assert "2.10.0 on node1" in skew["value"] and "2.9.0 on node2" in skew["value"], skew
    assert "pip install mindspore==" in skew["remedy"]


@pytest.mark.ssh
def test_a_python_without_mindspore(broken_cluster: tuple[Any, dict]) -> None:
    _, found = broken_cluster
    r = found[("node3", "mindspore")]
    assert r["status"] == "fail" and r["value"].startswith("not importable"), r
    assert r["remedy"] == "/usr/bin/python3 -m pip install mindspore"
    assert found[("node3", "python")]["status"] == "ok"


@pytest.mark.ssh
def test_an_interface_name_that_does_not_exist(broken_cluster: tuple[Any, dict]) -> None:
    _, found = broken_cluster
    r = found[("node3", "ifname.GLOO_SOCKET_IFNAME")]
    assert r["status"] == "fail" and r["value"] == "GLOO_SOCKET_IFNAME=nosuch0"
    assert "no interface nosuch0" in r["detail"] and "lo (up)" in r["detail"]
    assert found[("node1", "ifname")]["status"] == "n/a"


@pytest.mark.ssh
def test_a_leftover_ms_role_in_a_nodes_environment(broken_cluster: tuple[Any, dict]) -> None:
    _, found = broken_cluster
    r = found[("node1", "env.leftover")]
    assert r["status"] == "warn" and r["value"] == "MS_ROLE" and "MS_ROLE=MS_WORKER" in r["detail"]
    assert found[("node2", "env.leftover")]["status"] == "ok"


# ------------------------------------------------------------------ nodes that cannot be reached


@pytest.mark.ssh
def test_unreachable_nodes_get_one_plain_distinct_line_each(tmp_path: Path) -> None:
    """refused, no SFTP subsystem, a changed host key, a wrong key, a server that never answers:
    exit 4, one line per host, each saying what it is, and the same as results in the JSON."""
    require_sshd()
    cluster = start_sshd_cluster(tmp_path / "sshd", n=5)
    silent_host = "127.0.0.7"
    try:
        cluster.stop_node(cluster.nodes[1])  # node2: refused
        reconfigure_sshd(cluster, cluster.nodes[2], without_sftp)  # node3
        cluster.rotate_host_key(cluster.nodes[3])  # node4: the known_hosts entry no longer matches
        wrong_key = tmp_path / "wrong_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
        inv = ssh_inventory(tmp_path / "inv.yaml", cluster, 1, FAKE, FAKE_ARGS)
        with hold_port(cluster.port, silent_host):  # node6: accepts TCP, never says a word

            def nodes(doc: dict[str, Any]) -> None:
                doc["nodes"][4]["identity_file"] = str(wrong_key)  # node5: auth fails
                doc["nodes"].append({"host": silent_host, "name": "node6", "devices": 1})
                doc["ssh"]["connect_timeout_s"] = 2

            edit_inventory(inv, nodes)
            done = mscon("check", "--quick", inv, "--json", tmp_path / "c.json", cwd=tmp_path, timeout=120)
    finally:
        cluster.stop()
    assert done.code == 4, done.out + done.err
    lines = {line.split(":")[1].strip(): line for line in done.err.splitlines() if ": unreachable:" in line}
    assert set(lines) == {"node2", "node3", "node4", "node5", "node6"}, done.err
    assert "Connection refused" in lines["node2"]
    assert "the SSH server has no SFTP subsystem (Subsystem sftp in sshd_config" in lines["node3"]
    assert "HOST KEY MISMATCH" in lines["node4"]
    assert "authentication failed" in lines["node5"]
    assert "connect timed out after 2 s" in lines["node6"]
    assert "Session request failed" not in lines["node3"].split("(Subsystem")[0]
    found = results(tmp_path / "c.json")
    assert {n: found[(n, "ssh")]["value"] for n in ("node2", "node3", "node4", "node5", "node6")} == {
        "node2": "refused",
        "node3": "no SFTP",
        "node4": "host key changed",
        "node5": "auth failed",
        "node6": "timed out",
    }
    assert found[("node1", "protocol")]["status"] == "ok"


# ------------------------------------------------------------------ the job's arguments


@pytest.mark.parametrize(
    ("cmd", "needle"),
    [
        ([TRAIN, "--parallel-mode", "semi_parallel"], "did you mean 'semi_auto_parallel'"),
        ([TRAIN, "--device-num", "8"], "--device-num 8 does not match the 2 rank(s)"),
        ([TRAIN, "--parallel-mode", "semi_auto_parallel", "--exec-mode", "pynative"], "needs graph mode"),
        ([TRAIN, "--batch-size", "33"], "--batch-size 33 must divide evenly into 2 rank(s)"),
        ([FAKE, "--parallel_mode", "semi_parallel"], "did you mean 'semi_auto_parallel'"),
    ],
)
def test_config_lints_use_the_trainers_own_checks(tmp_path: Path, cmd: list[str], needle: str) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, FAKE_ARGS)
    done = mscon("check", "--quick", inv, "--json", tmp_path / "c.json", "--", *cmd, cwd=tmp_path)
    assert done.code == 3, done.out + done.err
    r = results(tmp_path / "c.json")[("*", "config")]
    assert r["status"] == "fail" and needle in r["value"], r
    assert r["remedy"] == "fix the arguments in the arguments after --"


def test_strategies_that_do_not_multiply_to_the_ranks(tmp_path: Path) -> None:
    inv = local_inventory(
        tmp_path / "inv.yaml",
        2,
        TRAIN,
        ["--device-target", "GPU", "--parallel-mode", "semi_auto_parallel", "--strategy", "3,1"],
    )
    edit_inventory(inv, lambda d: d.update(device_target="GPU"))
    done = mscon(
        "check", "--quick", "--skip-check", "devices", inv, "--json", tmp_path / "c.json", cwd=tmp_path
    )
    r = results(tmp_path / "c.json")[("*", "config")]
    assert r["status"] == "fail" and "every split must be a power of 2, got 3" in r["value"], r
    assert f"job.args of {inv}" in r["remedy"]
    assert done.code == 3


def test_unknown_skip_check_is_a_usage_error(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, FAKE, FAKE_ARGS)
    done = mscon("run", "--no-tui", inv, "--skip-check", "prot", cwd=tmp_path)
    assert done.code == 2 and "--skip-check prot: no such check" in done.err


def test_quick_checks_before_a_local_run_are_fast(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, FAKE, FAKE_ARGS)
    done = mscon("run", "--no-tui", inv, "--json", tmp_path / "s.json", cwd=tmp_path)
    assert done.code == 0, done.err
    pre = json.loads((tmp_path / "s.json").read_text())["preflight"]
    assert pre["fail"] == 0 and pre["skipped"] == []
    names = {r["name"] for r in pre["results"]}
    assert {"python", "shm", "port", "clock", "mesh", "sched", "protocol"} <= names
    assert "mindspore" not in names and "collective" not in names  # the slow ones are mscon check's
