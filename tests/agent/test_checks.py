"""The node preflight checks (agent/checks/), each fail and warn path driven for real where this
machine allows: a 16 MiB tmpfs, a port held open here, a Python without MindSpore, a fake MindSpore
first on PYTHONPATH, interface names that do not exist, leftovers in os.environ, and fake device
tools (nvidia-smi, npu-smi, hccn_tool) on PATH replaying the outputs under tests/agent/data/."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port  # free with the two above it, below the ephemeral range
from mscon.agent import checks as C
from mscon.agent.checks import env as env_checks
from mscon.agent.checks import ifname as ifname_checks
from mscon.agent.checks import limits as limits_checks
from mscon.agent.checks import ports as port_checks
from mscon.agent.checks import python_env, registry
from mscon.agent.checks import tools as node_tools
from mscon.agent.checks.params import Params
from mscon.agent.checks.smi import parse_npu_smi

DATA = Path(__file__).resolve().parent / "data"
STATUSES = {"ok", "warn", "fail", "n/a"}
ENV_VARS = (
    *env_checks.LEFTOVER_VARS,
    *ifname_checks.IFNAME_VARS,
    *(v for v, _ in env_checks.TIMEOUT_ORDER),
    "CUDA_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_SHM_DISABLE",
)


@pytest.fixture(autouse=True)
def clean_node_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process stands in for the node: none of what the checks read leaks in from outside."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    for var in list(os.environ):
        if var.startswith("NCCL_") and var.endswith("_DISABLE"):
            monkeypatch.delenv(var)
    monkeypatch.setattr(node_tools, "_FALLBACK_DIRS", ())  # only the fake tools on PATH count


def run(names: str | list[str], **params: object) -> dict[str, dict]:
    results = C.run_node_checks([names] if isinstance(names, str) else names, dict(params))
    for r in results:
        assert set(r) == {"name", "status", "value", "remedy", "detail"}, r
        assert r["status"] in STATUSES, r
        assert all(isinstance(v, str) for v in r.values()), r
        if r["status"] in ("fail", "warn"):
            assert r["remedy"], f"a {r['status']} without a remedy: {r}"
    json.dumps(results)  # goes on the wire as is
    by_name = {r["name"]: r for r in results}
    assert len(by_name) == len(results), f"duplicate result names: {results}"
    return by_name


# ------------------------------------------------------------------ fake tools


class Tools:
    """Fake executables in one folder; `env()` puts it first on the ranks' PATH."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.out = root / "outputs"
        self.bin.mkdir(parents=True)
        self.out.mkdir()
        self.empty = root / "empty-bin"
        self.empty.mkdir()

    def add(self, name: str, cases: list[tuple[str, str | Path, int]], sleep: float = 0) -> Path:
        """cases: (shell glob over the arguments, output (a data file name or literal text), exit code)."""
        lines = ["#!/bin/sh", "PATH=/usr/bin:/bin", 'case "$*" in']
        for i, (glob, output, rc) in enumerate(cases):
            if isinstance(output, Path) or (output.endswith((".csv", ".txt")) and (DATA / output).exists()):
                src = DATA / output
            else:
                src = self.out / f"{name}-{i}.txt"
                src.write_text(output)
            pause = f"sleep {sleep}; " if sleep else ""
            lines.append(f"  {glob}) {pause}cat '{src}'; exit {rc} ;;")
        lines += ["esac", f'echo "fake {name}: unexpected arguments: $*" >&2', "exit 64", ""]
        path = self.bin / name
        path.write_text("\n".join(lines))
        path.chmod(0o755)
        return path

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}", **extra}

    def no_tools_env(self, **extra: str) -> dict[str, str]:
        return {"PATH": str(self.empty), **extra}


@pytest.fixture
def tools(tmp_path: Path) -> Tools:
    return Tools(tmp_path / "tools")


def nvidia_smi(
    tools: Tools, gpus: str, apps: str = "nvidia-smi-apps-none.csv", rc: int = 0, kernel_log: str = ""
) -> None:
    tools.add(
        "nvidia-smi",
        [
            ("*--query-gpu=index,pci.bus_id*", "nvidia-smi-bus-8xA100.csv", 0),
            ("*--query-gpu=*", gpus, rc),
            ("*--query-compute-apps=*", apps, 0),
        ],
    )
    # The node's kernel log (where the driver reports Xid errors): this machine's own is not replayed.
    tools.add("dmesg", [("*", kernel_log or "[    0.000000] Linux version 6.1.0\n", 0)])


def hccn_tool(tools: Tools, n: int, link_down: tuple[int, ...] = (), faults: tuple[int, ...] = ()) -> None:
    cases: list[tuple[str, str | Path, int]] = []
    for i in range(n):
        cases.append((f"'-i {i} -link -g'", "link status: %s\n" % ("DOWN" if i in link_down else "UP"), 0))
        health = "Fault" if i in faults else "Success"
        cases.append((f"'-i {i} -net_health -g'", f"net health status: {health}\n", 0))
    tools.add("hccn_tool", cases)


# ------------------------------------------------------------------ the API


def test_api_names_order_and_unknown_checks() -> None:
    assert C.NODE_CHECKS == (
        "python",
        "mindspore",
        "devices",
        "shm",
        "limits",
        "disk",
        "port",
        "ifname",
        "env",
        "clock",
    )
    assert set(C.QUICK_CHECKS) < set(C.NODE_CHECKS)
    assert "mindspore" not in C.QUICK_CHECKS and "devices" not in C.QUICK_CHECKS
    results = C.run_node_checks(["clock", "nonsense", "clock", "shm"], {"shm_min_gib": 0})
    assert [r["name"] for r in results] == ["clock", "nonsense", "shm"]  # asked order, once each
    assert results[1]["status"] == "warn" and "unknown check" in results[1]["value"]
    assert set(registry.CHECKS) == set(C.NODE_CHECKS)  # every name the console may ask has a check


def test_the_agent_loads_no_check_until_asked() -> None:
    """The agent imports the mesh test (and device telemetry the tools' parsers) at start; the
    check families load on the first RunChecks only."""
    code = (
        "import sys, mscon.agent.main, mscon.agent.devices; "
        "print(sorted(m for m in sys.modules if m.startswith('mscon.agent.checks.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = {m.rsplit(".", 1)[1] for m in json.loads(done.stdout.replace("'", '"'))}
    assert loaded == {"mesh", "smi", "tools", "results"}, loaded


def test_never_raises_on_bad_params_or_a_crashing_check(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = {
        "devices": "eight",
        "env": ["x"],
        "shm_min_gib": "lots",
        "sched_port": float("inf"),
        "timeout_s": {},
    }
    assert C.run_node_checks(C.QUICK_CHECKS, bad)
    assert C.run_node_checks(["clock"], None)  # type: ignore[arg-type]

    def boom(p: Params) -> list[dict]:
        raise RuntimeError("kaput")

    monkeypatch.setitem(registry.CHECKS, "shm", boom)
    got = run(["shm", "clock"])
    assert got["shm"]["status"] == "warn" and "RuntimeError: kaput" in got["shm"]["value"]
    assert got["clock"]["status"] == "ok"


def test_quick_checks_take_well_under_a_second(tmp_path: Path) -> None:
    params = {
        "device_target": "GPU",
        "devices": 1,
        "python": sys.executable,
        "workdir": str(tmp_path),
        "sched_port": free_port(),
        "is_first": True,
        "sched_host": "127.0.0.1",
        "env": {"NCCL_SOCKET_IFNAME": "lo"},
        "console_time_ns": time.time_ns(),
    }
    C.run_node_checks(C.QUICK_CHECKS, params)  # warm the page cache
    t0 = time.monotonic()
    results = C.run_node_checks(C.QUICK_CHECKS, params)
    took = time.monotonic() - t0
    assert {r["name"].split(".")[0] for r in results} == set(C.QUICK_CHECKS)
    assert took < 1.0, f"QUICK_CHECKS took {took:.2f}s"


# ------------------------------------------------------------------ python, mindspore


def test_python_version_and_a_missing_python(tmp_path: Path) -> None:
    got = run("python", python=sys.executable)["python"]
    assert got["status"] == "ok" and got["value"] == "{}.{}.{}".format(*sys.version_info[:3])
    got = run("python", python=str(tmp_path / "no" / "python3"))["python"]
    assert got["status"] == "fail" and "not found" in got["value"]
    assert "python:" in got["remedy"]


def test_python_answered_in_process_only_when_the_ranks_run_this_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes: list[list[str]] = []
    real_run_cmd = python_env.run_cmd

    def counting(argv: list[str], *args: Any, **kw: Any) -> node_tools.Ran:
        probes.append(argv)
        return real_run_cmd(argv, *args, **kw)

    monkeypatch.setattr(python_env, "run_cmd", counting)
    assert run("python", python=sys.executable)["python"]["status"] == "ok"
    assert probes == []  # the agent's own interpreter: nothing to start
    # A PYTHONHOME the agent does not have changes what the ranks' python does: it is started, and
    # here it cannot even find its standard library.
    got = run("python", python=sys.executable, env={"PYTHONHOME": str(tmp_path)})["python"]
    assert len(probes) == 1 and got["status"] == "fail", got
    # Another interpreter is always started.
    other = tmp_path / "bin" / "python3"
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    got = run("python", python=str(other))["python"]
    assert len(probes) == 2 and got["status"] == "ok", got


def _mindspore_version() -> str | None:
    try:
        return metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(_mindspore_version() is None, reason="MindSpore is not installed in this Python")
def test_mindspore_real_import_reports_the_bare_version() -> None:
    got = run("mindspore", python=sys.executable)["mindspore"]  # the one real (slow) import
    assert got["status"] == "ok", got
    assert got["value"] == _mindspore_version()
    assert "mindspore" in got["detail"]


@pytest.fixture(scope="module")
def python_without_mindspore(tmp_path_factory: pytest.TempPathFactory) -> str:
    """/usr/bin/python3 where it lacks MindSpore, else a bare venv of this Python."""
    for cand in ("/usr/bin/python3", shutil.which("python3") or ""):
        if cand and os.path.exists(cand):
            done = subprocess.run([cand, "-c", "import mindspore"], capture_output=True, timeout=120)
            if done.returncode != 0:
                return cand
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


def test_a_python_without_mindspore_fails_with_the_pip_remedy(python_without_mindspore: str) -> None:
    got = run("mindspore", python=python_without_mindspore, mindspore_version="2.10.0")["mindspore"]
    assert got["status"] == "fail"
    assert "ModuleNotFoundError" in got["value"] or "No module named" in got["value"]
    assert got["remedy"] == f"{python_without_mindspore} -m pip install mindspore==2.10.0"


def _fake_mindspore(root: Path, body: str) -> Path:
    pkg = root / "mindspore"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return root


def test_the_job_env_pythonpath_decides_which_mindspore(
    tmp_path: Path, python_without_mindspore: str
) -> None:
    fake = _fake_mindspore(tmp_path / "site", '__version__ = "2.9.0"\n')
    env = {"PYTHONPATH": str(fake)}
    got = run("mindspore", python=python_without_mindspore, env=env)["mindspore"]
    assert (got["status"], got["value"]) == ("ok", "2.9.0")
    assert str(fake) in got["detail"]
    # The console pins a version: another one is a fail naming the pin.
    got = run("mindspore", python=python_without_mindspore, env=env, mindspore_version="2.10.0")["mindspore"]
    assert (got["status"], got["value"]) == ("fail", "2.9.0")
    assert got["remedy"].endswith("pip install mindspore==2.10.0") and "expected 2.10.0" in got["detail"]


def test_a_broken_mindspore_names_its_error(tmp_path: Path, python_without_mindspore: str) -> None:
    fake = _fake_mindspore(
        tmp_path / "site", 'raise OSError("libascendcl.so: cannot open shared object file")\n'
    )
    got = run("mindspore", python=python_without_mindspore, env={"PYTHONPATH": str(fake)})["mindspore"]
    assert got["status"] == "fail"
    assert "OSError: libascendcl.so" in got["value"]


def test_a_hanging_mindspore_import_is_cut_off(tmp_path: Path, python_without_mindspore: str) -> None:
    fake = _fake_mindspore(tmp_path / "site", "import time\ntime.sleep(60)\n")
    t0 = time.monotonic()
    got = run(
        "mindspore", python=python_without_mindspore, env={"PYTHONPATH": str(fake)}, mindspore_timeout_s=1
    )["mindspore"]
    assert time.monotonic() - t0 < 8
    assert got["status"] == "fail" and "no answer within 1s" in got["value"]


# ------------------------------------------------------------------ GPU


def test_gpu_healthy_node(tools: Tools) -> None:
    nvidia_smi(tools, "nvidia-smi-gpus-8xA100.csv")
    got = run("devices", device_target="GPU", devices=8, env=tools.env())
    assert list(got) == ["gpu.count", "gpu.visible", "gpu.driver", "gpu.busy", "gpu.ecc", "gpu.xid"]
    assert {r["status"] for r in got.values()} == {"ok"}, got
    assert got["gpu.xid"]["value"] == "none in the kernel log"
    assert got["gpu.count"]["value"] == "8 x NVIDIA A100-SXM4-80GB"
    assert got["gpu.driver"]["value"] == "535.129.03"
    assert got["gpu.busy"]["value"] == "idle"


def test_gpu_too_few(tools: Tools) -> None:
    nvidia_smi(tools, "nvidia-smi-gpus-2xRTX4090.csv")
    got = run("devices", device_target="GPU", devices=4, env=tools.env())
    assert got["gpu.count"]["status"] == "fail"
    assert got["gpu.count"]["value"] == "2 x NVIDIA GeForce RTX 4090"
    assert "devices: 2" in got["gpu.count"]["remedy"]
    assert got["gpu.ecc"]["status"] == "n/a"  # [N/A]: consumer GPUs have no ECC counters


def test_gpu_busy_and_ecc_are_warnings_naming_the_gpus(tools: Tools) -> None:
    nvidia_smi(tools, "nvidia-smi-gpus-8xA100-busy-ecc.csv", apps="nvidia-smi-apps-busy.csv")
    got = run("devices", device_target="GPU", devices=8, env=tools.env())
    assert got["gpu.count"]["status"] == "ok"
    busy = got["gpu.busy"]
    assert busy["status"] == "warn" and busy["value"] == "2 in use"
    assert "GPU 1: pid 31337" in busy["detail"]
    assert "GPU 5: 40963 of 81920 MiB in use by processes not visible here" in busy["detail"]
    ecc = got["gpu.ecc"]
    assert ecc["status"] == "warn" and ecc["value"] == "GPU 3: 2"
    # Only the GPUs the ranks will use count.
    got = run("devices", device_target="GPU", devices=2, env=tools.env(CUDA_VISIBLE_DEVICES="6,7"))
    assert (got["gpu.busy"]["status"], got["gpu.ecc"]["status"]) == ("ok", "ok")


def test_gpu_xid_errors_in_the_kernel_log(tools: Tools) -> None:
    nvidia_smi(tools, "nvidia-smi-gpus-8xA100.csv", kernel_log="dmesg-xid.txt")
    got = run("devices", device_target="GPU", devices=8, env=tools.env())["gpu.xid"]
    assert got["status"] == "fail", got
    assert got["value"] == (
        "GPU 2: Xid 13 x2; GPU 5: Xid 79 (fallen off the bus); GPU 7: Xid 48 (double-bit ECC error)"
    )
    assert "nvidia-smi -r -i N" in got["remedy"] and "--skip-check gpu.xid" in got["remedy"]
    assert "read with dmesg" in got["detail"]
    # Only the GPUs the ranks use: a program's fault (Xid 13) is a warning, not a failure.
    env = tools.env(CUDA_VISIBLE_DEVICES="1,2")
    got = run("devices", device_target="GPU", devices=2, env=env)["gpu.xid"]
    assert (got["status"], got["value"]) == ("warn", "GPU 2: Xid 13 x2"), got
    got = run("devices", device_target="GPU", devices=2, env=tools.env(CUDA_VISIBLE_DEVICES="0,1"))["gpu.xid"]
    assert (got["status"], got["value"]) == ("ok", "none on the GPUs the ranks use"), got


def test_gpu_xid_where_the_kernel_log_is_restricted(tools: Tools) -> None:
    nvidia_smi(tools, "nvidia-smi-gpus-8xA100.csv")
    denied = "dmesg: read kernel buffer failed: Operation not permitted\n"
    tools.add("dmesg", [("*", denied, 1)])
    tools.add("journalctl", [("'-k -b --no-pager -q'", "dmesg-xid.txt", 0)])
    got = run("devices", device_target="GPU", devices=8, env=tools.env())["gpu.xid"]
    assert got["status"] == "fail" and "read with journalctl" in got["detail"], got  # the journal instead
    tools.add("journalctl", [("*", "No journal files were found.\n", 1)])
    got = run("devices", device_target="GPU", devices=8, env=tools.env())["gpu.xid"]
    assert (got["status"], got["value"]) == ("n/a", "kernel log not readable"), got
    assert "Operation not permitted" in got["detail"] and "journalctl: exit code 1" in got["detail"]


def test_cuda_visible_devices_against_devices(tools: Tools, monkeypatch: pytest.MonkeyPatch) -> None:
    nvidia_smi(tools, "nvidia-smi-gpus-8xA100.csv")
    got = run("devices", device_target="GPU", devices=4, env=tools.env(CUDA_VISIBLE_DEVICES="0,1"))
    assert got["gpu.visible"]["status"] == "fail"
    assert "2 visible, 4 ranks" in got["gpu.visible"]["detail"]
    got = run("devices", device_target="GPU", devices=2, env=tools.env(CUDA_VISIBLE_DEVICES="0,9"))
    assert got["gpu.visible"]["status"] == "fail" and "no such device: 9" in got["gpu.visible"]["detail"]
    uuids = "GPU-4a3e2f1c,GPU-5b4f3a2d-9c8e-4f73-ad2b-1e6a7f8b9ca1"  # a prefix and a whole UUID
    got = run("devices", device_target="GPU", devices=2, env=tools.env(CUDA_VISIBLE_DEVICES=uuids))
    assert got["gpu.visible"]["status"] == "ok"
    # The node's own environment counts where the job's env does not set it; the job's env wins.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    got = run("devices", device_target="GPU", devices=2, env=tools.env())
    assert got["gpu.visible"]["status"] == "fail" and "CUDA_VISIBLE_DEVICES=3" in got["gpu.visible"]["value"]
    got = run("devices", device_target="GPU", devices=2, env=tools.env(CUDA_VISIBLE_DEVICES="2,3"))
    assert got["gpu.visible"]["status"] == "ok"


def test_gpu_tool_missing_failing_or_hanging(tools: Tools) -> None:
    got = run("devices", device_target="GPU", devices=1, env=tools.no_tools_env())
    assert list(got) == ["gpu.count"]
    assert got["gpu.count"]["status"] == "fail" and "nvidia-smi not found" in got["gpu.count"]["value"]
    got = run("devices", device_target="CPU", devices=1, env=tools.no_tools_env())
    assert got == {"devices": got["devices"]} and got["devices"]["status"] == "n/a"

    nvidia_smi(tools, "nvidia-smi-no-driver.txt", rc=9)
    got = run("devices", device_target="GPU", devices=1, env=tools.env())["gpu.count"]
    assert got["status"] == "fail" and "exit code 9" in got["value"]
    assert "couldn't communicate with the NVIDIA driver" in got["value"] + got["detail"]

    # A hung driver: the tool (and the `sleep` it started, holding its stdout) is killed on time.
    tools.add("nvidia-smi", [("*", "nvidia-smi-gpus-8xA100.csv", 0)], sleep=60)
    t0 = time.monotonic()
    got = run("devices", device_target="GPU", devices=1, env=tools.env(), timeout_s=1)["gpu.count"]
    assert time.monotonic() - t0 < 5
    assert got["status"] == "fail" and "no answer within 1s" in got["value"]


# ------------------------------------------------------------------ Ascend


def test_ascend_healthy_node(tools: Tools) -> None:
    tools.add("npu-smi", [("info", "npu-smi-info-910b3x8.txt", 0)])
    hccn_tool(tools, 8)
    got = run("devices", device_target="Ascend", devices=8, env=tools.env())
    assert list(got) == [
        "npu.count",
        "npu.visible",
        "npu.driver",
        "npu.health",
        "npu.busy",
        "npu.link",
        "npu.net",
    ]
    assert {r["status"] for r in got.values()} == {"ok"}, got
    assert got["npu.count"]["value"] == "8 x 910B3"
    assert got["npu.driver"]["value"] == "23.0.6"
    assert got["npu.link"]["value"] == "8 up"


def test_ascend_unhealthy_busy_and_too_few(tools: Tools) -> None:
    tools.add("npu-smi", [("info", "npu-smi-info-910b3x8-unhealthy-busy.txt", 0)])
    hccn_tool(tools, 8)
    got = run("devices", device_target="Ascend", devices=8, env=tools.env())
    health = got["npu.health"]
    assert health["status"] == "fail"  # Alarm is a major alarm
    assert health["value"] == "NPU 5 chip 0: Alarm, NPU 6 chip 0: Warning"
    busy = got["npu.busy"]
    assert busy["status"] == "warn" and "NPU 2 chip 0: pid 1712733 python3.9" in busy["detail"]
    # A Warning alone is a warn; the ranks' NPUs only (ASCEND_RT_VISIBLE_DEVICES).
    got = run("devices", device_target="Ascend", devices=2, env=tools.env(ASCEND_RT_VISIBLE_DEVICES="6,7"))
    assert (got["npu.health"]["status"], got["npu.health"]["value"]) == ("warn", "NPU 6 chip 0: Warning")
    assert got["npu.busy"]["status"] == "ok"
    got = run("devices", device_target="Ascend", devices=16, env=tools.env())
    assert got["npu.count"]["status"] == "fail" and "need 16 NPUs" in got["npu.count"]["detail"]


def test_ascend_visible_devices(tools: Tools) -> None:
    tools.add("npu-smi", [("info", "npu-smi-info-910b3x8.txt", 0)])
    hccn_tool(tools, 8)
    got = run("devices", device_target="Ascend", devices=4, env=tools.env(ASCEND_RT_VISIBLE_DEVICES="0,1"))
    assert got["npu.visible"]["status"] == "fail" and "2 visible, 4 ranks" in got["npu.visible"]["detail"]
    got = run("devices", device_target="Ascend", devices=1, env=tools.env(ASCEND_RT_VISIBLE_DEVICES="8"))
    assert got["npu.visible"]["status"] == "fail" and "no such device: 8" in got["npu.visible"]["detail"]


def test_ascend_link_down_and_net_fault(tools: Tools) -> None:
    tools.add("npu-smi", [("info", "npu-smi-info-910b3x8.txt", 0)])
    hccn_tool(tools, 8, link_down=(3,), faults=(5,))
    got = run("devices", device_target="Ascend", devices=8, env=tools.env())
    assert got["npu.link"]["status"] == "fail" and got["npu.link"]["value"] == "device 3: DOWN"
    assert got["npu.net"]["status"] == "warn" and got["npu.net"]["value"] == "device 5: Fault"
    # A single-node job does not use the NPU ports.
    got = run("devices", device_target="Ascend", devices=8, nodes=1, env=tools.env())
    assert (got["npu.link"]["status"], got["npu.net"]["status"]) == ("n/a", "n/a")


def test_ascend_two_chips_per_npu(tools: Tools) -> None:
    tools.add("npu-smi", [("info", "npu-smi-info-a3-2npu-4chips.txt", 0)])
    hccn_tool(tools, 4, link_down=(3,))  # hccn_tool -i takes the chip's Phy-ID here
    got = run("devices", device_target="Ascend", devices=4, env=tools.env())
    assert got["npu.count"]["value"] == "4 x Ascend910" and got["npu.count"]["status"] == "ok"
    assert got["npu.driver"]["value"] == "25.3.rc1"
    assert got["npu.link"]["value"] == "device 3: DOWN"


def test_ascend_tools_missing(tools: Tools) -> None:
    got = run("devices", device_target="Ascend", devices=8, env=tools.no_tools_env())
    assert list(got) == ["npu.count"]
    assert got["npu.count"]["status"] == "fail" and "npu-smi not found" in got["npu.count"]["value"]
    tools.add("npu-smi", [("info", "npu-smi-info-910b3x8.txt", 0)])  # npu-smi, but no hccn_tool
    got = run("devices", device_target="Ascend", devices=8, env=tools.env())
    assert got["npu.count"]["status"] == "ok"
    assert (got["npu.link"]["status"], got["npu.net"]["status"]) == ("n/a", "n/a")
    got = run("devices", device_target="CPU", env=tools.no_tools_env())
    assert got["devices"]["status"] == "n/a"


def test_parse_npu_smi_table() -> None:
    table = parse_npu_smi((DATA / "npu-smi-info-910b3x8-unhealthy-busy.txt").read_text())
    chips = table.chips
    assert table.version == "23.0.6"
    assert [c.npu for c in chips] == list(range(8))
    assert chips[2].bus == "0000:81:00.0" and (chips[2].hbm_used, chips[2].hbm_total) == (52318, 65536)
    assert [(q.npu, q.chip, q.pid, q.name) for q in table.procs] == [(2, 0, 1712733, "python3.9")]


# ------------------------------------------------------------------ shm, limits, disk


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 16 MiB tmpfs, as a container's /dev/shm would be (Docker's default is 64 MiB)."""
    where = tmp_path / "shm"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_shm_too_small_names_the_docker_default_and_the_remedies(small_tmpfs: Path) -> None:
    got = run("shm", shm_path=str(small_tmpfs), shm_min_gib=8)["shm"]
    assert got["status"] == "fail"
    assert got["value"] == "16 MiB free of 16 MiB"
    assert "64 MiB is the default /dev/shm of a Docker container" in got["detail"]
    assert "--shm-size=8g" in got["remedy"] and "mount -o remount,size=8G" in got["remedy"]
    assert run("shm", shm_path=str(small_tmpfs), shm_min_gib=0.01)["shm"]["status"] == "ok"


def test_shm_full_of_stale_files(small_tmpfs: Path) -> None:
    (small_tmpfs / "stale").write_bytes(b"\0" * (14 * 1024 * 1024))
    got = run("shm", shm_path=str(small_tmpfs), shm_min_gib=0.005)["shm"]  # 5 MiB wanted, 2 left
    assert got["status"] == "fail" and got["value"] == "2 MiB free of 16 MiB"
    assert got["remedy"].startswith(f"free {small_tmpfs}")


def test_shm_a_folder_or_nothing(tmp_path: Path) -> None:
    assert run("shm", shm_path=str(tmp_path), shm_min_gib=0.001)["shm"]["status"] == "ok"
    got = run("shm", shm_path=str(tmp_path), shm_min_gib=1e9)["shm"]
    assert got["status"] == "fail" and "64 MiB" not in got["detail"]
    got = run("shm", shm_path=str(tmp_path / "absent"))["shm"]
    assert got["status"] == "fail" and "mount -t tmpfs" in got["remedy"]


def test_limits_from_the_real_rlimits(monkeypatch: pytest.MonkeyPatch) -> None:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:  # lower the soft limits (always allowed), put them back after
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, nofile[1]))
        low_memlock = 64 * 1024 if memlock[1] == resource.RLIM_INFINITY else min(64 * 1024, memlock[1])
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (low_memlock, memlock[1]))
        got = run("limits", device_target="GPU")
        assert got["limits.nofile"]["status"] == "warn" and got["limits.nofile"]["value"].startswith("1024 ")
        assert "nofile=65536:65536" in got["limits.nofile"]["remedy"]
        assert got["limits.memlock"]["status"] == "warn" and got["limits.memlock"]["value"].startswith(
            "64 KiB"
        )
        assert "--ulimit memlock=-1" in got["limits.memlock"]["remedy"]
        assert run("limits", device_target="CPU")["limits.memlock"]["status"] == "ok"
        assert run("limits", device_target="Ascend")["limits.memlock"]["status"] == "warn"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, memlock)
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(65536, nofile[0]), max(65536, nofile[1])))
        raised = True
    except (ValueError, OSError):  # raising a hard limit needs CAP_SYS_RESOURCE
        raised = False
        real = resource.getrlimit
        unlimited = {
            resource.RLIMIT_MEMLOCK: (resource.RLIM_INFINITY,) * 2,
            resource.RLIMIT_NOFILE: (65536,) * 2,
        }
        monkeypatch.setattr(
            limits_checks.resource, "getrlimit", lambda which: unlimited.get(which) or real(which)
        )
    try:
        got = run("limits", device_target="GPU")
        assert got["limits.memlock"]["status"] == "ok" and got["limits.memlock"]["value"].startswith(
            "unlimited"
        )
        assert got["limits.nofile"]["status"] == "ok"
    finally:
        if raised:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, memlock)
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile)


def test_disk_free_in_workdir_and_checkpoint_dir(tmp_path: Path, small_tmpfs: Path) -> None:
    got = run("disk", workdir=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt" / "not-yet"))
    assert got["disk.workdir"]["status"] == "ok" and got["disk.workdir"]["value"].endswith("free")
    ckpt = got["disk.checkpoint_dir"]
    assert ckpt["status"] == "ok" and f"not there yet: {tmp_path}" in ckpt["detail"]
    got = run("disk", workdir=str(tmp_path), checkpoint_dir=str(small_tmpfs / "ckpt"), disk_min_gib=1)
    assert got["disk.workdir"]["status"] == "ok"
    assert got["disk.checkpoint_dir"]["status"] == "fail"
    assert got["disk.checkpoint_dir"]["value"] == "16 MiB free"
    assert str(small_tmpfs) in got["disk.checkpoint_dir"]["remedy"]
    assert list(run("disk")) == ["disk.workdir"]  # no checkpoint dir given: one result


# ------------------------------------------------------------------ port


@pytest.fixture
def held_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def test_port_free_busy_and_other_nodes(held_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    free = free_port()
    got = run("port", sched_port=free, is_first=True, sched_host="127.0.0.1")["port"]
    assert (got["status"], got["value"]) == ("ok", f"{free} free")
    assert run("port", sched_port=held_port, is_first=False)["port"]["status"] == "n/a"
    assert run("port", is_first=True)["port"]["status"] == "n/a"

    # Held on 127.0.0.1 only: binding 0.0.0.0 already collides.
    got = run("port", sched_port=held_port, is_first=True)["port"]
    assert got["status"] == "fail"
    assert got["value"].startswith(f"{held_port} in use by pid {os.getpid()} (")
    assert "another scheduler.port" in got["remedy"] and "stop the process" in got["remedy"]
    # No psutil on the node: /proc tells the same.
    monkeypatch.setattr(port_checks, "psutil_module", lambda: None)
    got = run("port", sched_port=held_port, is_first=True, sched_host="127.0.0.1")["port"]
    assert got["status"] == "fail" and f"by pid {os.getpid()} (" in got["value"]


def test_standby_ports_free_or_held(held_port: int) -> None:
    free = free_port()
    got = run("port", sched_port=free, is_first=True, standby_ports=[free + 1, free + 2])
    assert got["port"]["status"] == "ok"
    assert (got["standby port"]["status"], got["standby port"]["value"]) == (
        "ok",
        f"{free + 1}, {free + 2} free",
    )
    # A busy standby port costs no run, only the speed of a restart: a warning, naming the holder.
    got = run("port", sched_port=free, is_first=True, standby_ports=[held_port])["standby port"]
    assert got["status"] == "warn" and got["value"].startswith(f"{held_port} (held by pid {os.getpid()} (")
    assert "a restart would start cold" in got["value"] and "restart.standby: imported" in got["remedy"]
    assert "standby port" not in run("port", sched_port=free, is_first=True)  # no standby: no result


def test_a_standby_port_held_by_mscons_kept_spare_is_ok(tmp_path: Path) -> None:
    """A kept standby's spare (``python .../spare_boot.py``) holds the port: mscon's own, taken or
    ended by this run. Told by its whole command line, even behind paths longer than a description."""
    deep = tmp_path.joinpath(*["a-rather-long-folder-name-on-a-real-node"] * 4)
    deep.mkdir(parents=True)
    boot = deep / "spare_boot.py"
    boot.write_text(
        "import socket, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
    )
    spare = subprocess.Popen(
        [sys.executable, str(boot)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert spare.stdout is not None
        port = int(spare.stdout.readline())
        assert "spare_boot.py" not in port_checks.port_holder(port)  # the description is cut before it
        got = run("port", sched_port=free_port(), is_first=True, standby_ports=[port])["standby port"]
        assert got["status"] == "ok" and got["value"].startswith(f"{port} held by mscon's standby")
    finally:
        spare.kill()
        spare.wait()


def test_port_sched_host_that_is_not_this_node() -> None:
    got = run("port", sched_port=free_port(), is_first=True, sched_host="192.0.2.1")["port"]  # TEST-NET-1
    assert got["status"] == "warn" and "not an address of this node" in got["value"]
    got = run("port", sched_port=free_port(), is_first=True, sched_host="no-such-host.invalid")["port"]
    assert got["status"] == "fail" and "does not resolve" in got["value"]


# ------------------------------------------------------------------ ifname


def test_ifname_that_does_not_exist_names_those_that_do(monkeypatch: pytest.MonkeyPatch) -> None:
    got = run("ifname", device_target="GPU", env={"NCCL_SOCKET_IFNAME": "nosuch0"})
    r = got["ifname.NCCL_SOCKET_IFNAME"]
    assert r["status"] == "fail" and "no interface nosuch0" in r["detail"]
    assert "lo (up)" in r["detail"]  # the real interfaces of this machine
    assert (
        run("ifname", env={"NCCL_SOCKET_IFNAME": "=lo"}, device_target="GPU")["ifname.NCCL_SOCKET_IFNAME"][
            "status"
        ]
        == "ok"
    )
    # The node's own environment counts too.
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch1")
    assert run("ifname")["ifname.GLOO_SOCKET_IFNAME"]["status"] == "fail"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert run("ifname")["ifname"]["status"] == "n/a"


@pytest.fixture
def fake_net(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A /sys/class/net with eth0 (up), eth1 (admin down), ib0 (up), docker0 (up), lo (unknown: up)."""
    root = tmp_path / "net"
    for name, state, flags in [
        ("eth0", "up", "0x1003"),
        ("eth1", "down", "0x1002"),
        ("ib0", "up", "0x1003"),
        ("docker0", "up", "0x1003"),
        ("lo", "unknown", "0x9"),
    ]:
        (root / name).mkdir(parents=True)
        (root / name / "operstate").write_text(state + "\n")
        (root / name / "flags").write_text(flags + "\n")
    monkeypatch.setattr(ifname_checks, "_SYS_NET", str(root))


@pytest.mark.parametrize(
    ("spec", "status", "says"),
    [
        ("eth", "ok", "selects eth0"),  # a prefix: eth0 and eth1, one of them up
        ("eth1", "fail", "eth1 down"),
        ("=eth", "fail", "no interface eth"),  # = wants the exact name
        ("=eth0", "ok", "selects eth0"),
        ("eth0,ib", "ok", "selects eth0, ib0"),
        ("eth0,bond", "warn", "no interface bond (using eth0)"),  # a typo beside a good one
        ("^docker", "ok", "selects eth0, ib0"),  # everything but docker*, lo, and what is down
        ("^=eth0,ib0,docker0", "fail", "excludes every interface that is up"),
        ("^eth,ib,docker", "fail", "excludes every interface that is up"),
    ],
)
def test_ifname_forms(fake_net: None, spec: str, status: str, says: str) -> None:
    got = run("ifname", device_target="GPU", env={"NCCL_SOCKET_IFNAME": spec})["ifname.NCCL_SOCKET_IFNAME"]
    assert got["status"] == status, got
    assert says in got["detail"], got
    if status != "ok":
        assert "eth0 (up), eth1 (down)" in got["detail"]


def test_ifname_relevance_and_gloo_exact_names(fake_net: None) -> None:
    env = {"NCCL_SOCKET_IFNAME": "nosuch", "HCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth"}
    got = run("ifname", device_target="Ascend", env=env)
    assert got["ifname.NCCL_SOCKET_IFNAME"]["status"] == "warn"  # wrong, but Ascend does not use NCCL
    assert got["ifname.HCCL_SOCKET_IFNAME"]["status"] == "ok"
    assert got["ifname.GLOO_SOCKET_IFNAME"]["status"] == "fail"  # Gloo takes whole names, not prefixes
    assert run("ifname", device_target="GPU", env=env)["ifname.NCCL_SOCKET_IFNAME"]["status"] == "fail"
    assert run("ifname", env={"GLOO_SOCKET_IFNAME": ""})["ifname.GLOO_SOCKET_IFNAME"]["status"] == "warn"


# ------------------------------------------------------------------ env, clock


def test_env_leftovers_in_the_nodes_own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run("env")["env.leftover"]["status"] == "ok"
    # The job's env is mscon's own business: not a leftover.
    assert run("env", env={"MS_ROLE": "MS_WORKER"})["env.leftover"]["status"] == "ok"
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    monkeypatch.setenv("RANK_TABLE_FILE", "/etc/hccl_8p.json")
    got = run("env")["env.leftover"]
    assert got["status"] == "warn" and got["value"] == "MS_ROLE, RANK_TABLE_FILE"
    assert "MS_ROLE=MS_SCHED" in got["detail"] and "Address already in use" in got["detail"]


def test_env_nccl_disable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run("env", env={"NCCL_P2P_DISABLE": "0"})["env.nccl_disable"]["status"] == "ok"
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    got = run("env", env={"NCCL_P2P_DISABLE": "1"})["env.nccl_disable"]
    assert got["status"] == "warn" and got["value"] == "NCCL_IB_DISABLE, NCCL_P2P_DISABLE"


def _rank_table(path: Path, servers: list[list[int]], **extra: object) -> str:
    """A rank table in the documented format (version 1.0): ``servers`` lists each server's rank ids."""
    doc = {
        "version": "1.0",
        "server_count": str(len(servers)),
        "server_list": [
            {
                "server_id": f"10.0.0.{i + 1}",
                "device": [
                    {"device_id": str(d), "device_ip": f"192.168.{i}.{d}", "rank_id": str(r)}
                    for d, r in enumerate(ranks)
                ],
                "host_nic_ip": "reserve",
            }
            for i, ranks in enumerate(servers)
        ],
        "status": "completed",
        **extra,
    }
    path.write_text(json.dumps(doc, indent=1))
    return str(path)


def test_env_rank_table_against_the_inventory(tmp_path: Path) -> None:
    got = run("env", world_size=16)["env.rank_table"]
    assert got["status"] == "n/a" and "dynamic networking" in got["detail"]
    good = _rank_table(tmp_path / "ok.json", [list(range(8)), list(range(8, 16))])
    got = run("env", env={"RANK_TABLE_FILE": good}, world_size=16)["env.rank_table"]
    assert (got["status"], got["value"]) == ("ok", "16 devices on 2 servers"), got
    # The seeds' "device_num / rank table size differs from the cluster": one server's table for two.
    short = _rank_table(tmp_path / "short.json", [list(range(8))])
    got = run("env", env={"RANK_TABLE_FILE": short}, world_size=16)["env.rank_table"]
    assert got["status"] == "fail" and got["value"] == "it lists 8 devices, the inventory launches 16 ranks"
    assert "unset RANK_TABLE_FILE" in got["remedy"] and got["detail"] == short
    twice = _rank_table(tmp_path / "twice.json", [[0, 1], [1, 3]])
    got = run("env", env={"RANK_TABLE_FILE": twice}, world_size=4)["env.rank_table"]
    assert got["status"] == "fail" and "rank_id values are not 0..3, each once" in got["value"]
    counted = _rank_table(tmp_path / "count.json", [[0, 1]], server_count="2")
    got = run("env", env={"RANK_TABLE_FILE": counted}, world_size=2)["env.rank_table"]
    assert got["status"] == "fail" and "server_count 2 but 1 servers listed" in got["value"]
    pending = _rank_table(tmp_path / "pending.json", [[0, 1]], status="initializing")
    assert run("env", env={"RANK_TABLE_FILE": pending}, world_size=2)["env.rank_table"]["status"] == "warn"
    (tmp_path / "bad.json").write_text("{not json")
    for path in (tmp_path / "bad.json", tmp_path / "missing.json"):
        got = run("env", env={"RANK_TABLE_FILE": str(path)}, world_size=2)["env.rank_table"]
        assert got["status"] == "fail" and got["value"].startswith("unreadable: "), got


def test_env_timeout_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run("env")["env.timeouts"]["status"] == "n/a"  # nothing set: MindSpore's and CANN's defaults
    good = {
        "MS_NODE_TIMEOUT": "60",
        "HCCL_CONNECT_TIMEOUT": "300",
        "MS_TOPO_TIMEOUT": "900",
        "HCCL_EXEC_TIMEOUT": "3600",
    }
    assert run("env", env=good)["env.timeouts"]["status"] == "ok"
    got = run("env", env={"HCCL_CONNECT_TIMEOUT": "7200"})["env.timeouts"]
    assert got["status"] == "warn"
    assert "HCCL_CONNECT_TIMEOUT (7200 s) should be below MS_TOPO_TIMEOUT (600 s, default)" in got["detail"]
    assert "below HCCL_EXEC_TIMEOUT (1800 s, default)" in got["detail"]
    monkeypatch.setenv("MS_NODE_TIMEOUT", "900")  # the node's env counts as well
    got = run("env", env={"MS_TOPO_TIMEOUT": "600"})["env.timeouts"]
    assert got["status"] == "warn"
    assert "MS_NODE_TIMEOUT (900 s) should be below MS_TOPO_TIMEOUT (600 s)" in got["detail"]
    got = run("env", env={"HCCL_EXEC_TIMEOUT": "soon"})["env.timeouts"]
    assert got["status"] == "warn" and "not a number of seconds" in got["detail"]


def test_clock_value_and_offset() -> None:
    before = time.time_ns()
    got = run("clock", console_time_ns=before - 250_000_000)["clock"]
    node_ns = int(got["value"])
    assert before <= node_ns <= time.time_ns()
    offset_ms = float(got["detail"].split(" ms", 1)[0])
    assert 250 <= offset_ms < 1250
    assert run("clock")["clock"]["status"] == "ok"


# ------------------------------------------------------------------ the mesh listener


def test_the_mesh_listener_never_keeps_the_scheduler_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's ephemeral pick can be the scheduler's port (a port in the ephemeral range, seen
    here as a failed port check while the mesh ran): the listener takes another one."""
    from mscon.agent.checks import mesh

    original = mesh._bind_ephemeral
    taken = original(socket.AF_INET, "127.0.0.1")
    sched = taken.getsockname()[1]
    first = [taken]  # the kernel's first pick is the scheduler's port

    def pick(family: int, addr: str) -> socket.socket:
        return first.pop() if first else original(family, addr)

    monkeypatch.setattr(mesh, "_bind_ephemeral", pick)
    listener = mesh.MeshListener("node1", "tok", 5.0, "127.0.0.1", avoid=(sched,))
    try:
        assert listener.port != sched and listener.port > 0
        assert taken.fileno() == -1  # the scheduler's port was let go
        got = mesh.probe_peer({"name": "node1", "host": "127.0.0.1", "port": listener.port}, "tok", 2.0)
        assert got["ok"], got
    finally:
        listener.close()
