"""Preflight without SSH or MindSpore: the console-side checks as pure functions, the table, and the
orchestration inside the Supervisor against in-process fake agents (tests/engine/fake_agent.py)
that answer RunChecks and the mesh messages from a script."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, TESTS

sys.path.insert(0, str(TESTS / "engine"))
from fake_agent import FakeChannel, FakeCluster, FakeTransport, NodeConfig, all_exit  # noqa: E402
from mscon.agent import policy as policy_mod  # noqa: E402
from mscon.agent.protocol import (  # noqa: E402
    CheckResult,
    ChecksDone,
    MeshListen,
    MeshListening,
    MeshProbe,
    MeshResult,
    Message,
    RunChecks,
    Start,
)
from mscon.console.config.inventory import load_inventory  # noqa: E402
from mscon.console.engine import exit_codes  # noqa: E402
from mscon.console.engine import session as session_mod  # noqa: E402
from mscon.console.engine import supervisor as supervisor_mod  # noqa: E402
from mscon.console.engine.commands import StopJob  # noqa: E402
from mscon.console.engine.events import (  # noqa: E402
    CheckReported,
    ChecksFinished,
    CheckStatus,
    Event,
    JobState,
    RunResult,
    from_json,
    to_json,
)
from mscon.console.engine.state import ClusterState  # noqa: E402
from mscon.console.engine.supervisor import RunOptions, Supervisor  # noqa: E402
from mscon.console.preflight import checks as cc  # noqa: E402
from mscon.console.preflight import report as check_report  # noqa: E402
from mscon.console.preflight import runner as preflight_mod  # noqa: E402
from mscon.console.preflight.runner import Preflight, PreflightOptions  # noqa: E402
from mscon.console.transport.base import TransportKind  # noqa: E402

OK, WARN, FAIL, NA = CheckStatus.OK, CheckStatus.WARN, CheckStatus.FAIL, CheckStatus.NA


def rep(node: str, name: str, status: CheckStatus, value: str = "", remedy: str = "") -> CheckReported:
    return CheckReported(0, node, name, status, value, remedy)


# ------------------------------------------------------------------ checks across nodes


def test_one_mindspore_version_everywhere_or_a_fail_naming_each() -> None:
    same = cc.same_version(
        "mindspore",
        {"a": rep("a", "mindspore", OK, "2.10.0"), "b": rep("b", "mindspore", OK, "2.10.0")},
        FAIL,
    )
    assert same.status is OK and same.node == cc.ALL and "2.10.0 on every node" in same.value
    skew = cc.same_version(
        "mindspore",
        {n: rep(n, "mindspore", OK, v) for n, v in (("a", "2.10.0"), ("b", "2.9.0"), ("c", "2.10.0"))},
        FAIL,
    )
    assert skew.status is FAIL
    assert "2.10.0 on a, c" in skew.value and "2.9.0 on b" in skew.value
    assert "pip install mindspore==2.10.0" in skew.remedy  # the majority's version
    # A node without MindSpore fails on its own; the others are still compared.
    missing = {
        "a": rep("a", "mindspore", OK, "2.10.0"),
        "b": rep("b", "mindspore", FAIL, "not importable: x"),
    }
    assert cc.same_version("mindspore", missing, FAIL).status is NA


def test_driver_skew_is_a_warning() -> None:
    found = cc.same_version(
        "gpu.driver",
        {"a": rep("a", "gpu.driver", OK, "535.104.05"), "b": rep("b", "gpu.driver", OK, "550.54.15")},
        WARN,
    )
    assert found.status is WARN and "535.104.05 on a" in found.value


def test_clock_offsets_are_corrected_by_half_the_round_trip() -> None:
    # The node read 1_000_500 while the request took 1_000_000..1_001_000: exactly in the middle.
    s = cc.ClockSample(node_ns=1_000_500, sent_ns=1_000_000, received_ns=1_001_000)
    assert s.offset_ns == 0 and s.rtt_ns == 1000
    # Three readings: the shortest round trip wins (NTP's filter).
    best = cc.best_sample([cc.ClockSample(5, 0, 100), cc.ClockSample(52, 50, 54), cc.ClockSample(9, 0, 20)])
    assert best.rtt_ns == 4
    base = 10**18
    samples = {
        "a": cc.ClockSample(base + 1_000_000, base, base + 2_000_000),  # offset 0
        "b": cc.ClockSample(base + int(2.5e9), base, base + 2_000_000),  # 2.5 s ahead
    }
    found = {(r.node, r.name): r for r in cc.clock_results(samples)}
    assert found[("a", "clock")].status is OK and found[("a", "clock")].value.startswith("+0.0")
    assert found[("b", "clock")].status is WARN and "+2.50 s" in found[("b", "clock")].value
    skew = found[(cc.ALL, "clock")]
    assert skew.status is WARN and "b ahead of a" in skew.value and "chrony" in skew.remedy
    close = {
        "a": cc.ClockSample(base, base, base + 10),
        "b": cc.ClockSample(base + int(0.5e9), base, base + 10),
    }
    assert all(r.status is OK for r in cc.clock_results(close))


def _probe(name: str, ok: bool = True, rtt: float = 0.2, error: str = "") -> dict[str, Any]:
    return {"name": name, "host": "h", "port": 1, "ok": ok, "rtt_ms": rtt if ok else None, "error": error}


def test_mesh_matrix_and_the_scheduler_address() -> None:
    nodes = ["a", "b"]
    targets = {"a": ("10.0.0.1", 4000), "b": ("10.0.0.2", 4001)}
    full = {"a": [_probe("a"), _probe("b", rtt=0.4)], "b": [_probe("a", rtt=0.3), _probe("b")]}
    mesh = cc.mesh_result(nodes, targets, full)
    assert mesh.status is OK and "2 x 2 connected" in mesh.value and "max 0.40 ms" in mesh.value
    assert "a -> b" in mesh.detail
    broken = {"a": full["a"], "b": [_probe("a", ok=False, error="Connection refused"), _probe("b")]}
    bad = cc.mesh_result(nodes, targets, broken)
    assert bad.status is FAIL and "b -> a (10.0.0.1:4000): Connection refused" in bad.value
    port_ok = rep("a", "port", OK, "8118 free")
    sched = cc.sched_result("10.0.0.1", 8118, "a", full, port_ok)
    assert sched.status is OK and sched.value == "10.0.0.1:8118" and "port 8118 is free on a" in sched.detail
    unreachable = cc.sched_result("10.0.0.1", 8118, "a", broken, port_ok)
    assert unreachable.status is FAIL and "b: Connection refused" in unreachable.detail
    assert "scheduler.host" in unreachable.remedy
    wrong_host = {"a": full["a"], "b": [_probe("a", ok=False, error="reached c instead"), _probe("b")]}
    assert "reached c instead" in cc.sched_result("127.0.0.1", 8118, "a", wrong_host, None).detail


@pytest.mark.parametrize(
    ("error", "name", "value"),
    [
        ("n (h:22): connect timed out after 5 s", "ssh", "timed out"),
        ("n (h:22): cannot connect: Connection refused", "ssh", "refused"),
        ("n (h:22): authentication failed: Permission denied", "ssh", "auth failed"),
        (
            "n (h:22): HOST KEY MISMATCH: the server's key differs from the one in kh; refusing",
            "ssh",
            "host key changed",
        ),
        ("n (h:22): unknown host key (no entry in kh); verify it and add it", "ssh", "unknown host key"),
        (
            "n (h:22): the SSH server has no SFTP subsystem (Subsystem sftp in sshd_config; ...)",
            "ssh",
            "no SFTP",
        ),
        (
            "n: the agent speaks protocol 1, this console 2; remove ~/.cache/mscon/agent-*",
            "protocol",
            "agent 1, console 2",
        ),
        ("n: something else entirely", "ssh", "unreachable"),
    ],
)
def test_reach_errors_are_told_apart(error: str, name: str, value: str) -> None:
    found = cc.reach_result("n", TransportKind.SSH, error)
    assert (found.name, found.status, found.value) == (name, FAIL, value)
    assert found.detail == error and (found.remedy or value == "unreachable")


def test_a_failure_is_named_by_the_transport_it_happened_on() -> None:
    srun = "vm: no agent connected; srun exited with 127: : 1: exec: /no/python: not found"
    found = cc.reach_result("vm", TransportKind.SRUN, srun)
    assert (found.name, found.value) == ("srun", "python not found") and "python:" in found.remedy
    local = "local: the agent did not start with /no/python: [Errno 2] No such file or directory"
    found = cc.reach_result("local", TransportKind.LOCAL, local)
    assert (found.name, found.value) == ("local", "no agent") and "sshd" not in found.remedy


def test_protocol_result() -> None:
    assert cc.protocol_result("a", 2, 2).status is OK
    assert cc.protocol_result("a", 1, 2).value == "agent 1, console 2"


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (["--parallel-mode", "semi_parallel"], "semi_parallel"),
        (["--parallel_mode", "auto"], "auto"),
        (["--lr", "1", "--parallel-mode=dp"], "dp"),
        (["parallel_mode=hybrid"], "hybrid"),
        (["--epochs", "1"], None),
        (["--parallel-mode"], None),
    ],
)
def test_parallel_mode_is_found_in_a_scripts_arguments(args: list[str], value: str | None) -> None:
    assert cc.parallel_mode_arg(args) == value


def test_config_result_reads_the_trainers_one_line() -> None:
    failed = cc.config_result(
        {"ok": False, "code": 2, "error": "train.py: error: --device-num 8 does not match the 4 rank(s)\n"},
        "trainer/train.py",
        "job.args of x.yaml",
    )
    assert failed.status is FAIL and failed.value == "--device-num 8 does not match the 4 rank(s)"
    assert failed.remedy == "fix the arguments in job.args of x.yaml"
    assert cc.config_result({"ok": True}, "s", "w").status is OK
    assert cc.config_result({"why": "cannot load"}, "s", "w").status is NA


def test_skip_matches_a_check_and_its_results() -> None:
    assert cc.skipped("gpu.busy", ("gpu",)) and cc.skipped("port", ("port",))
    assert not cc.skipped("gpu", ("gpu.busy",)) and not cc.skipped("portable", ("port",))
    assert preflight_mod.known_check("limits.nofile") and preflight_mod.known_check("mesh")
    assert not preflight_mod.known_check("prot")


def _smoke(records: list[dict], ok: bool = True, world: int = 2, target: str = "CPU") -> cc.SmokeOutcome:
    return cc.SmokeOutcome(
        ok, "all ranks finished" if ok else "r1 failed", tuple(records), 9.0, "/logs", target, world
    )


def test_collective_results() -> None:
    lines = [
        'MSCON_SMOKE {"kind":"check","rank":0,"size":2,"ok":true,"got":3.0,"expected":3.0,"bytes":4096,'
        '"allreduce_ms":1.5,"init_s":2.0}',
        "an unrelated line",
        'MSCON_SMOKE {"kind":"check","rank":1,"size":2,"ok":true,"got":3.0,"expected":3.0,"bytes":4096,'
        '"allreduce_ms":2.5,"init_s":1.0}',
        "MSCON_SMOKE not json",
    ]
    records = cc.smoke_records(lines)
    assert len(records) == 2
    (good,) = cc.collective_results(_smoke(records))
    assert good.status is OK and "2 ranks: sum 3 ok, 2.00 ms" in good.value and "untested" not in good.detail
    wrong = [dict(records[0]), dict(records[1], ok=False, got=2.0)]
    (bad,) = cc.collective_results(_smoke(wrong, ok=False))
    assert bad.status is FAIL and "wrong sum on rank 1: 2.0 != 3.0" in bad.value and "/logs" in bad.remedy
    (missing,) = cc.collective_results(_smoke(records[:1], ok=False))
    assert missing.status is FAIL and "1 of 2 ranks reduced: r1 failed" in missing.value


def test_device_sweep_reports_bus_bandwidth_of_the_slowest_rank_and_says_it_is_untested() -> None:
    checks = [
        {"kind": "check", "rank": r, "ok": True, "expected": 3.0, "allreduce_ms": 0.1, "bytes": 4096}
        for r in (0, 1)
    ]
    sweep = [
        {"kind": "sweep", "rank": 0, "bytes": 2**20, "busbw_gbs": 10.0},
        {"kind": "sweep", "rank": 1, "bytes": 2**20, "busbw_gbs": 8.0},
        {"kind": "sweep", "rank": 0, "bytes": 2**28, "busbw_gbs": 90.0},
        {"kind": "sweep", "rank": 1, "bytes": 2**28, "busbw_gbs": 95.0},
    ]
    found = cc.collective_results(_smoke(checks + sweep, target="GPU"))
    assert [r.name for r in found] == ["collective", "collective.busbw"]
    assert found[1].value == "90.0 GB/s bus bandwidth at 256 MiB"
    assert "1 MiB 8.00 GB/s" in found[1].detail and cc.UNTESTED_SWEEP in found[1].detail
    assert cc.UNTESTED_SWEEP in found[0].detail


def test_cpu_sweep_reports_bus_bandwidth_without_the_hardware_note() -> None:
    checks = [
        {"kind": "check", "rank": r, "ok": True, "expected": 3.0, "allreduce_ms": 0.1, "bytes": 4096}
        for r in (0, 1)
    ]
    sweep = [{"kind": "sweep", "rank": r, "bytes": 1024, "busbw_gbs": 0.05 + r} for r in (0, 1)]
    found = cc.collective_results(_smoke(checks + sweep, target="CPU"))
    assert [r.name for r in found] == ["collective", "collective.busbw"]
    assert found[1].value == "0.1 GB/s bus bandwidth at 1 KiB"  # the slower rank's
    assert cc.UNTESTED_SWEEP not in found[0].detail + found[1].detail


def test_the_smoke_script_sweeps_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import mscon.console.preflight.smoke as smoke

    assert smoke.sweep_sizes(0) == ()
    assert smoke.sweep_sizes(2**20) == (1024, 4096, 16384, 65536, 262144, 1048576)
    assert smoke.sweep_sizes(256 * 2**20)[-1] == 256 * 2**20 and len(smoke.sweep_sizes(256 * 2**20)) == 10
    asked: list[tuple[str, int]] = []
    monkeypatch.setattr(smoke, "worker", lambda target, sweep_max: asked.append((target, sweep_max)) or 0)
    monkeypatch.delenv("MS_ROLE", raising=False)
    monkeypatch.setenv("DEVICE_TARGET", "GPU")
    smoke.main(["--sweep-max-bytes", "1048576"])
    smoke.main([])
    smoke.main(["--sweep-max-bytes", "lots"])
    assert asked == [("GPU", 2**20), ("GPU", 0), ("GPU", 0)]


@pytest.mark.parametrize(
    ("target", "sweep", "expected"),
    [("CPU", None, 0), ("CPU", True, 2**20), ("GPU", None, 256 * 2**20), ("Ascend", False, 0)],
)
def test_the_sweep_is_on_for_devices_and_asked_for_on_cpu(
    target: str, sweep: bool | None, expected: int
) -> None:
    assert Preflight(PreflightOptions(sweep=sweep))._sweep_max_bytes(target) == expected
    skipped = Preflight(PreflightOptions(sweep=True, skip=("collective.busbw",)))
    assert skipped._sweep_max_bytes(target) == 0


# ------------------------------------------------------------------ the table


def _results() -> list[CheckReported]:
    return [
        rep("a", "python", OK, "3.11.7"),
        rep("b", "python", OK, "3.11.7"),
        rep("a", "limits.memlock", OK, "unlimited"),
        rep("a", "limits.nofile", WARN, "1024 (hard 4096)", "raise it"),
        rep("b", "limits.memlock", OK, "unlimited"),
        rep("b", "limits.nofile", OK, "65536"),
        rep("a", "port", FAIL, "8118 in use by pid 7", "choose another scheduler.port"),
        rep("b", "port", NA),
        rep("a", "devices", NA, "CPU"),
        rep("b", "devices", NA, "CPU"),
        rep(cc.ALL, "mindspore", FAIL, "differ: 2.10.0 on a; 2.9.0 on b", "install one version"),
    ]


def test_table_groups_results_per_check_and_lists_remedies() -> None:
    lines = check_report.format_table(_results(), ["a", "b"], colour=False)
    text = "\n".join(lines)
    assert lines[0].split() == ["node", "python", "limits", "port"]  # devices: n/a everywhere
    assert "n/a on every node: devices" in text
    row_a = next(line for line in lines if line.startswith("a "))
    assert "! nofile: 1024" in row_a and "X 8118 in use" in row_a
    row_b = next(line for line in lines if line.startswith("b "))
    assert "n/a" in row_b
    assert "across nodes:" in text and "mindspore  fail  differ: 2.10.0 on a; 2.9.0 on b" in text
    fix = text.split("to fix:")[1].splitlines()
    assert fix[1].strip() == "FAIL all nodes: mindspore: differ: 2.10.0 on a; 2.9.0 on b"
    assert "-> choose another scheduler.port" in text and "WARN a: limits.nofile" in text
    assert "\x1b[" not in text


def test_colour_only_at_a_terminal_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    coloured = "\n".join(check_report.format_table(_results(), ["a", "b"], colour=True))
    assert "\x1b[1;31m" in coloured and "\x1b[33m" in coloured

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert check_report.wants_colour(Tty())
    assert not check_report.wants_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not check_report.wants_colour(Tty())


# ------------------------------------------------------------------ orchestration with fake agents


@dataclass
class NodeChecks:
    """What a fake node answers: its check results, its clock's offset, whether it can be dialled."""

    results: list[dict[str, str]] = field(default_factory=list)
    clock_offset_s: float = 0.0
    listen: bool = True
    silent: bool = False  # never answers RunChecks
    lose_on_checks: bool = False


def _ok(name: str, value: str = "") -> dict[str, str]:
    return {"name": name, "status": "ok", "value": value, "remedy": "", "detail": ""}


DEFAULT = [
    _ok("python", "3.11.7"),
    _ok("mindspore", "2.10.0"),
    _ok("shm", "1 GiB free"),
    _ok("env.leftover", "none"),
]


def _patch_agents(monkeypatch: pytest.MonkeyPatch, nodes: dict[str, NodeChecks]) -> list[tuple[str, Message]]:
    """FakeChannel also answers preflight: RunChecks from ``nodes``, the mesh from its listeners."""
    seen: list[tuple[str, Message]] = []
    listening: dict[str, int] = {}
    original = FakeChannel._dispatch

    def dispatch(self: FakeChannel, msg: Message) -> None:
        seen.append((self.node, msg))
        cfg = nodes.get(self.node, NodeChecks(results=DEFAULT))
        if isinstance(msg, RunChecks):
            if cfg.lose_on_checks:
                self.lose()
                return
            if cfg.silent:
                return
            if tuple(msg.names) == ("clock",):
                now = time.time_ns() + int(cfg.clock_offset_s * 1e9)
                self._emit(CheckResult(node=self.node, name="clock", status="ok", value=str(now)))
            else:
                for r in cfg.results:
                    if r["name"].split(".")[0] in msg.names:
                        self._emit(CheckResult(node=self.node, **r))
            self._emit(ChecksDone(node=self.node))
        elif isinstance(msg, MeshListen):
            if cfg.listen:
                listening[self.node] = 40000 + len(listening)
                self._emit(MeshListening(node=self.node, port=listening[self.node]))
            else:
                self._emit(MeshListening(node=self.node, error="cannot listen: no"))
        elif isinstance(msg, MeshProbe):
            found = tuple(
                {**p, "ok": True, "rtt_ms": 0.1, "error": ""} for p in msg.peers if p["name"] in listening
            )
            self._emit(MeshResult(node=self.node, results=found))
        else:
            original(self, msg)

    monkeypatch.setattr(FakeChannel, "_dispatch", dispatch)
    return seen


def _inventory(tmp_path: Path, script: str = "train.py", args: list[str] | None = None) -> Any:
    workdir = tmp_path / "wd"
    workdir.mkdir(exist_ok=True)
    (workdir / script).parent.mkdir(parents=True, exist_ok=True)
    if not (workdir / script).exists():
        (workdir / script).write_text("print('never run by the fakes')\n")
    doc = {
        "name": "fake",
        "device_target": "CPU",
        "nodes": [
            {"name": "a", "host": "10.0.0.1", "devices": 2},
            {"name": "b", "host": "10.0.0.2", "devices": 2},
        ],
        "scheduler": {"port": 8118},
        "job": {"workdir": str(workdir), "script": script, "args": args or ["--epochs", "1"]},
        "stop": {"grace_s": 1},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_inventory(path)


@dataclass
class Checked:
    result: RunResult
    events: list[Event]
    preflight: Preflight
    cluster: FakeCluster

    def reported(self) -> dict[tuple[str, str], CheckReported]:
        return {(e.node, e.name): e for e in self.events if isinstance(e, CheckReported)}


async def _run(
    tmp_path: Path,
    options: PreflightOptions,
    inv: Any = None,
    on_start: Callable[[Supervisor], None] | None = None,
) -> Checked:
    inv = inv or _inventory(tmp_path)
    cluster = FakeCluster(home_root=tmp_path / "homes", script=all_exit(["sched", "r0", "r1", "r2", "r3"]))
    pf = Preflight(options)
    sup = Supervisor(
        inv,
        RunOptions(logs_root=tmp_path / "runs", preflight=pf),
        transport_factory=cluster,
    )
    events: list[Event] = []
    sup.bus.add_sink("test", events.append)
    if on_start is not None:
        on_start(sup)
    result = await asyncio.wait_for(sup.run(), 20)
    return Checked(result, events, pf, cluster)


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_mod, "SCHEDULER_LINGER_S", 0.2)
    monkeypatch.setattr(supervisor_mod, "_TICK_S", 0.05)


async def test_check_only_reports_every_node_and_across_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _patch_agents(monkeypatch, {})
    done = await _run(tmp_path, PreflightOptions(checks_only=True))
    assert done.result.exit_code == exit_codes.OK and done.result.status is JobState.SUCCEEDED
    found = done.reported()
    for node in ("a", "b"):
        assert found[(node, "python")].status is OK and found[(node, "protocol")].status is OK
        assert found[(node, "clock")].status is OK
    assert found[(cc.ALL, "mindspore")].value == "2.10.0 on every node"
    assert found[(cc.ALL, "mesh")].status is OK and found[(cc.ALL, "sched")].value == "10.0.0.1:8118"
    assert found[(cc.ALL, "clock")].status is OK
    assert not any(isinstance(m, Start) for _, m in seen)  # nothing was launched
    # The clock is read in round trips of its own, three per node, never among the slow checks.
    runs = [m for n, m in seen if isinstance(m, RunChecks) and n == "a"]
    assert [tuple(m.names) for m in runs[:3]] == [("clock",)] * 3 and "clock" not in runs[3].names
    assert runs[0].params["is_first"] and runs[0].params["sched_host"] == "10.0.0.1"
    assert not next(m for n, m in seen if isinstance(m, RunChecks) and n == "b").params["is_first"]
    finished = [e for e in done.events if isinstance(e, ChecksFinished)]
    assert len(finished) == 1 and finished[0].failed == ()
    # Every result replays into the same state (the TUI reads it there).
    state = ClusterState()
    for e in done.events:
        state.apply(from_json(json.loads(json.dumps(to_json(e)))))
    assert state.checks[(cc.ALL, "mesh")].status is OK and state.checks_finished == finished[0]


async def test_a_fail_refuses_to_launch_with_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port_fail = {
        "name": "port",
        "status": "fail",
        "value": "8118 in use by pid 7",
        "remedy": "x",
        "detail": "",
    }
    seen = _patch_agents(monkeypatch, {"a": NodeChecks(results=[*DEFAULT, port_fail])})
    done = await _run(tmp_path, PreflightOptions(quick=True))
    assert done.result.exit_code == exit_codes.PREFLIGHT and done.result.status is JobState.FAILED
    assert "a: port (8118 in use by pid 7)" in done.result.reason
    assert not any(isinstance(m, Start) for _, m in seen)
    (finished,) = [e for e in done.events if isinstance(e, ChecksFinished)]
    assert finished.failed == ("a: port",)


async def test_a_skipped_check_is_not_run_and_the_job_launches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port_fail = {"name": "port", "status": "fail", "value": "in use", "remedy": "x", "detail": ""}
    seen = _patch_agents(monkeypatch, {"a": NodeChecks(results=[*DEFAULT, port_fail])})
    done = await _run(tmp_path, PreflightOptions(quick=True, skip=("port",)))
    assert done.result.exit_code == exit_codes.OK, done.result.reason
    assert any(isinstance(m, Start) for _, m in seen)
    asked = [m for _, m in seen if isinstance(m, RunChecks) and "python" in m.names]
    assert asked and all("port" not in m.names for m in asked)
    (finished,) = [e for e in done.events if isinstance(e, ChecksFinished)]
    assert finished.skipped == ("port",) and finished.failed == ()


async def test_version_skew_and_clock_skew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = [_ok("python", "3.11.7"), _ok("mindspore", "2.9.0")]
    _patch_agents(monkeypatch, {"b": NodeChecks(results=old, clock_offset_s=3.0)})
    done = await _run(tmp_path, PreflightOptions(checks_only=True))
    found = done.reported()
    assert done.result.exit_code == exit_codes.PREFLIGHT
    skew = found[(cc.ALL, "mindspore")]
    assert skew.status is FAIL and "2.10.0 on a" in skew.value and "2.9.0 on b" in skew.value
    assert found[("b", "clock")].status is WARN and found[("b", "clock")].value.startswith("+3.0")
    assert found[(cc.ALL, "clock")].status is WARN and "b ahead of a" in found[(cc.ALL, "clock")].value


@pytest.mark.parametrize("checks_only", [True, False])
async def test_the_workdir_goes_to_the_nodes_only_when_the_job_will_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checks_only: bool
) -> None:
    """`mscon check` starts no rank of the job: its workdir is neither packed nor copied (on a large
    workdir that is most of a check's time). `mscon run` packs it once and copies it to every node."""
    _patch_agents(monkeypatch, {})
    packed: list[Path] = []
    uploaded: list[str] = []
    real_pack = session_mod.workdir_archive

    def pack(root: Path, excludes: tuple[str, ...], max_bytes: int | None = None) -> Any:
        packed.append(root)
        return real_pack(root, excludes, max_bytes)

    async def upload(self: FakeTransport, archive: Any) -> str:
        uploaded.append(self.node.name)
        return f"{self.cache_root}/sync/{archive.filename}"

    monkeypatch.setattr(session_mod, "workdir_archive", pack)
    monkeypatch.setattr(FakeTransport, "syncs_workdir", property(lambda self: True))
    monkeypatch.setattr(FakeTransport, "upload_workdir", upload)
    done = await _run(tmp_path, PreflightOptions(checks_only=checks_only, quick=True))
    assert done.result.exit_code == exit_codes.OK, done.result
    if checks_only:
        assert packed == [] and uploaded == []
    else:
        assert len(packed) == 1 and sorted(uploaded) == ["a", "b"]


async def test_a_node_that_cannot_listen_fails_the_mesh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patch_agents(monkeypatch, {"b": NodeChecks(results=DEFAULT, listen=False)})
    done = await _run(tmp_path, PreflightOptions(checks_only=True, quick=True))
    mesh = done.reported()[(cc.ALL, "mesh")]
    assert mesh.status is FAIL and "b could not listen" in mesh.value
    assert done.reported()[(cc.ALL, "sched")].status is OK  # b can still reach the scheduler's node


async def test_a_node_lost_during_the_checks_is_exit_4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _patch_agents(monkeypatch, {"b": NodeChecks(lose_on_checks=True)})
    done = await _run(tmp_path, PreflightOptions(quick=True))
    assert done.result.exit_code == exit_codes.UNREACHABLE
    assert "b: lost the node during the checks" in done.result.reason
    assert done.reported()[("b", "checks")].status is FAIL
    assert not any(isinstance(m, Start) for _, m in seen)


async def test_ctrl_c_during_the_checks_ends_them_and_restores_the_inbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patch_agents(monkeypatch, {"b": NodeChecks(silent=True)})

    def stop_soon(sup: Supervisor) -> None:
        asyncio.get_running_loop().call_later(0.5, sup.submit, StopJob("interrupted (Ctrl-C)"))

    t0 = time.monotonic()
    done = await _run(tmp_path, PreflightOptions(quick=True), on_start=stop_soon)
    assert done.result.exit_code == exit_codes.INTERRUPTED and time.monotonic() - t0 < 5


async def test_unreachable_nodes_become_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _patch_agents(monkeypatch, {})
    inv = _inventory(tmp_path)
    cluster = FakeCluster(
        home_root=tmp_path / "homes",
        nodes={"b": NodeConfig(connect_error="cannot connect: Connection refused")},
    )
    pf = Preflight(PreflightOptions(checks_only=True))
    sup = Supervisor(inv, RunOptions(logs_root=tmp_path / "runs", preflight=pf), transport_factory=cluster)
    events: list[Event] = []
    sup.bus.add_sink("test", events.append)
    result = await asyncio.wait_for(sup.run(), 20)
    assert result.exit_code == exit_codes.UNREACHABLE
    found = {(e.node, e.name): e for e in events if isinstance(e, CheckReported)}
    assert found[("b", "ssh")].value == "refused" and found[("a", "protocol")].status is OK
    assert any(isinstance(e, ChecksFinished) and e.failed == ("b: ssh",) for e in events)


async def test_config_lint_runs_the_trainers_own_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patch_agents(monkeypatch, {})
    # The job's workdir holds the real trainer, as the repository does.
    inv = _inventory(tmp_path)
    job = dataclasses.replace(inv.job, workdir=REPO, script="trainer/train.py", args=("--batch-size", "30"))
    inv = dataclasses.replace(inv, job=job)
    done = await _run(tmp_path, PreflightOptions(checks_only=True, quick=True), inv=inv)
    config = done.reported()[(cc.ALL, "config")]
    assert config.status is FAIL and "--batch-size 30 must divide evenly into 4 rank(s)" in config.value
