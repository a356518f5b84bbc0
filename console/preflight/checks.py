"""Preflight checks the console computes: across nodes, and of the job's configuration.

Pure functions from what the nodes reported (their check results, clock readings, mesh probes,
the smoke test's output lines) to ``CheckReported`` events; no I/O here (``preflight.py`` asks the
nodes and runs the lint subprocess). Results across nodes carry the node ``"*"``.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mscon.console.engine.events import CheckReported, CheckStatus
from mscon.console.transport import reach
from mscon.console.transport.base import TransportKind
from mscon.console.transport.bundle import REMOVE_OLD_AGENTS

ALL = "*"  # the node of a result that is about the cluster, not one node
CLOCK_WARN_S = 1.0  # beyond this, failures on different nodes may be ordered wrongly
SMOKE_TAG = "MSCON_SMOKE "
# Checks computed here (their names for --skip-check), besides the nodes' own (agent/checks/).
CONSOLE_CHECKS = ("ssh", "protocol", "clock", "mesh", "sched", "config", "collective")
# MindSpore's parallel modes; the trainer's config.py owns the hints (imported in the lint run).
PARALLEL_MODES = ("stand_alone", "data_parallel", "semi_auto_parallel", "auto_parallel", "hybrid_parallel")

_VERSION = re.compile(r"^\d+(\.\d+)*[A-Za-z0-9.+-]*$")
_MISMATCH = re.compile(r"speaks protocol (\S+), this console (\S+);")


def result(
    node: str, name: str, status: CheckStatus, value: str = "", remedy: str = "", detail: str = ""
) -> CheckReported:
    return CheckReported(0, node, name, status, value, remedy, detail)


def skipped(name: str, skips: Sequence[str]) -> bool:
    """``--skip-check gpu`` skips gpu.count, gpu.driver, ...; ``--skip-check gpu.busy`` only that."""
    return any(name == s or name.startswith(s + ".") for s in skips)


def status_of(text: str) -> CheckStatus:
    try:
        return CheckStatus(text)
    except ValueError:  # an agent that says something else: worth a look, not a refusal
        return CheckStatus.WARN


# ------------------------------------------------------------------ the same on every node


def _by_value(values: Mapping[str, str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for node, value in values.items():
        groups.setdefault(value, []).append(node)
    return groups


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:4])


def _groups_text(groups: Mapping[str, list[str]]) -> str:
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), tuple(-p for p in _version_key(kv[0]))))
    return "; ".join(f"{value} on {', '.join(nodes)}" for value, nodes in ordered)


def same_version(
    name: str, per_node: Mapping[str, CheckReported], status_on_skew: CheckStatus
) -> CheckReported:
    """One value of ``name`` (MindSpore's version, the GPU driver) across the nodes that report one."""
    values = {n: r.value for n, r in per_node.items() if _VERSION.match(r.value or "")}
    missing = sorted(set(per_node) - set(values))
    if len(values) < 2:
        return result(ALL, name, CheckStatus.NA, "fewer than two nodes report one")
    groups = _by_value(values)
    note = f" ({', '.join(missing)}: none)" if missing else ""
    if len(groups) == 1:
        (value,) = groups
        return result(ALL, name, CheckStatus.OK, f"{value} on every node{note}")
    # What most nodes have; on a tie, the newest (upgrading is the usual way to make them agree).
    majority = max(groups, key=lambda v: (len(groups[v]), _version_key(v)))
    if name == "mindspore":
        remedy = f"install one MindSpore version on every node (pip install mindspore=={majority})"
        why = "ranks with different MindSpore versions fail or hang in the collective set-up"
    else:
        remedy = f"install one driver version on every node (most have {majority})"
        why = "mixed drivers are a common cause of NCCL/HCCL errors that name no culprit"
    return result(ALL, name, status_on_skew, "differ: " + _groups_text(groups) + note, remedy, why)


# ------------------------------------------------------------------ clocks


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One clock reading of a node (``node_ns``) between the console's send and receive times."""

    node_ns: int
    sent_ns: int
    received_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.received_ns - self.sent_ns

    @property
    def offset_ns(self) -> int:
        # The node read its clock somewhere in the round trip; the middle is the best guess.
        return self.node_ns - (self.sent_ns + self.received_ns) // 2


def best_sample(samples: Sequence[ClockSample]) -> ClockSample:
    """The reading with the shortest round trip has the smallest error (NTP's filter)."""
    return min(samples, key=lambda s: s.rtt_ns)


def _seconds(ns: float) -> str:
    s = ns / 1e9
    return f"{s * 1000:+.1f} ms" if abs(s) < 1 else f"{s:+.2f} s"


def clock_results(samples: Mapping[str, ClockSample], warn_s: float = CLOCK_WARN_S) -> list[CheckReported]:
    out = []
    remedy = "synchronise the clocks (chrony or ntpd); mscon orders failures across nodes by their clocks"
    for node, s in samples.items():
        bad = abs(s.offset_ns) > warn_s * 1e9
        out.append(
            result(
                node,
                "clock",
                CheckStatus.WARN if bad else CheckStatus.OK,
                f"{_seconds(s.offset_ns).removesuffix(' ms')}±{s.rtt_ns / 2e6:.1f} ms"
                if abs(s.offset_ns) < 1e9
                else _seconds(s.offset_ns),
                remedy if bad else "",
                f"offset from the console's clock, corrected by half the round trip "
                f"({s.rtt_ns / 1e6:.1f} ms); node time_ns {s.node_ns}",
            )
        )
    if len(samples) >= 2:
        lo = min(samples, key=lambda n: samples[n].offset_ns)
        hi = max(samples, key=lambda n: samples[n].offset_ns)
        skew = samples[hi].offset_ns - samples[lo].offset_ns
        error = (samples[hi].rtt_ns + samples[lo].rtt_ns) / 2
        bad = skew > warn_s * 1e9
        out.append(
            result(
                ALL,
                "clock",
                CheckStatus.WARN if bad else CheckStatus.OK,
                f"skew {_seconds(skew).lstrip('+')} ({hi} ahead of {lo})",
                remedy if bad else "",
                f"largest difference between two nodes' clocks, ±{error / 1e6:.1f} ms; "
                f"warn above {warn_s:g} s",
            )
        )
    return out


# ------------------------------------------------------------------ the TCP mesh and the scheduler


def mesh_result(
    nodes: Sequence[str],
    targets: Mapping[str, tuple[str, int]],
    probes: Mapping[str, Sequence[Mapping] | None],
) -> CheckReported:
    """Every node connected to every node's listener (itself included): the matrix and its RTTs."""
    failures: list[str] = []
    rtts: list[tuple[float, str]] = []
    rows = ["from \\ to  " + "  ".join(nodes)]
    for src in nodes:
        got = {str(p.get("name")): p for p in (probes.get(src) or ())}
        cells = []
        for dst in nodes:
            p = got.get(dst)
            host, port = targets.get(dst, ("?", 0))
            if probes.get(src) is None:
                failures.append(f"{src}: no answer to the mesh probe")
                cells.append("?")
                break
            if p is None or not p.get("ok"):
                why = (p or {}).get("error") or "not probed"
                failures.append(f"{src} -> {dst} ({host}:{port}): {why}")
                cells.append("X")
            else:
                rtt = float(p.get("rtt_ms") or 0.0)
                rtts.append((rtt, f"{src} -> {dst}"))
                cells.append(f"{rtt:.2f}")
        rows.append(f"{src}  " + "  ".join(cells))
    matrix = "TCP connect round trip, ms (X: failed): " + " | ".join(rows)
    n = len(nodes)
    if failures:
        return result(
            ALL,
            "mesh",
            CheckStatus.FAIL,
            f"{len(failures)} of {n * n} connections failed: {failures[0]}",
            "open TCP between the nodes (firewall, security groups) and give each node an address the "
            "others reach (nodes[].address)",
            "; ".join(failures[:20]) + " | " + matrix,
        )
    worst = max(rtts) if rtts else (0.0, "")
    median = statistics.median(r for r, _ in rtts) if rtts else 0.0
    return result(
        ALL,
        "mesh",
        CheckStatus.OK,
        f"{n} x {n} connected, rtt median {median:.2f} ms, max {worst[0]:.2f} ms",
        "",
        f"max on {worst[1]} | {matrix}",
    )


def sched_result(
    sched_host: str,
    port: int,
    first: str,
    probes: Mapping[str, Sequence[Mapping] | None],
    port_check: CheckReported | None,
) -> CheckReported:
    """MS_SCHED_HOST is reachable from every node; with "port" free on the first node, so is the
    scheduler's port (MindSpore binds it there)."""
    where = f"{sched_host}:{port}"
    unreachable = []
    for src, found in probes.items():
        p = next((p for p in (found or ()) if p.get("name") == first), None)
        if p is None or not p.get("ok"):
            unreachable.append(f"{src}: {(p or {}).get('error') or 'no answer'}")
    if port_check is None:
        port_note = f"port {port} not checked"
    elif port_check.status is CheckStatus.OK:
        port_note = f"port {port} is free on {first}"
    else:
        port_note = (
            f"port {port} on {first}: {port_check.status.value} ({port_check.value}), see the port check"
        )
    if unreachable:
        return result(
            ALL,
            "sched",
            CheckStatus.FAIL,
            f"{sched_host} not reachable from {len(unreachable)} node(s)",
            f"set scheduler.host (or the first node's address) to an IP of {first} that every node reaches",
            f"MS_SCHED_HOST={sched_host} must reach {first}: " + "; ".join(unreachable) + f"; {port_note}",
        )
    return result(
        ALL, "sched", CheckStatus.OK, where, "", f"every node reaches {first} at {sched_host}; {port_note}"
    )


# ------------------------------------------------------------------ reaching the nodes


def reach_result(node: str, kind: TransportKind, error: str) -> CheckReported:
    """A node the console could not reach or start the agent on, under the name of the transport
    it failed on (ssh, srun, local); protocol mismatches separately."""
    mismatch = _MISMATCH.search(error)
    if mismatch:
        return result(
            node,
            "protocol",
            CheckStatus.FAIL,
            f"agent {mismatch.group(1)}, console {mismatch.group(2)}",
            REMOVE_OLD_AGENTS,
            error,
        )
    found = reach.problem(kind, error)
    return result(node, kind.value, CheckStatus.FAIL, found.value, found.remedy, error)


def protocol_result(node: str, agent: int, console: int) -> CheckReported:
    if agent == console:
        return result(node, "protocol", CheckStatus.OK, str(agent))
    return result(
        node,
        "protocol",
        CheckStatus.FAIL,
        f"agent {agent}, console {console}",
        REMOVE_OLD_AGENTS,
    )


# ------------------------------------------------------------------ the job's configuration


def parallel_mode_arg(args: Sequence[str]) -> str | None:
    """The value of --parallel-mode / --parallel_mode / parallel_mode=... in a script's arguments."""
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key.lstrip("-").replace("-", "_") != "parallel_mode":
            continue
        if eq:
            return value
        if key.startswith("-") and i + 1 < len(args):
            return args[i + 1]
    return None


def config_result(answer: Mapping | None, subject: str, where: str) -> CheckReported:
    """The trainer's own checks (trainer/config.py, run by preflight in a subprocess), as a result.

    ``answer``: {"ok": bool, "error": "train.py: error: ..."} or None when they could not run."""
    remedy = f"fix the arguments in {where}"
    if answer is None or ("error" not in answer and not answer.get("ok")):
        return result(
            ALL, "config", CheckStatus.NA, f"{subject}: not checked", "", str((answer or {}).get("why", ""))
        )
    if answer.get("ok"):
        return result(ALL, "config", CheckStatus.OK, f"{subject}: ok", "", str(answer.get("detail", "")))
    error = str(answer.get("error") or "").strip().splitlines()
    line = error[-1] if error else f"exit code {answer.get('code')}"
    line = line.removeprefix("train.py: error: ")
    return result(ALL, "config", CheckStatus.FAIL, line, remedy, f"{subject}: {line}")


# ------------------------------------------------------------------ the collective smoke test


@dataclass(frozen=True, slots=True)
class SmokeOutcome:
    """What the smoke run left: its verdict, every MSCON_SMOKE record, and where its logs are."""

    ok: bool  # every rank exited 0
    reason: str  # the run's one-line verdict
    records: tuple[Mapping, ...]
    wall_s: float
    logs_dir: str
    target: str
    world: int


def smoke_records(lines: Sequence[str]) -> list[dict]:
    out = []
    for line in lines:
        if line.startswith(SMOKE_TAG):
            try:
                rec = json.loads(line[len(SMOKE_TAG) :])
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


UNTESTED_SWEEP = (
    "the sweep runs in mscon's tests on CPU ranks (MCCL); it has not run on GPU/Ascend hardware there"
)


def collective_results(smoke: SmokeOutcome) -> list[CheckReported]:
    checks = [r for r in smoke.records if r.get("kind") == "check"]
    ranks_ok = sorted(int(r.get("rank", -1)) for r in checks if r.get("ok"))
    remedy = (
        f"see the smoke test's logs in {smoke.logs_dir}; a collective that cannot form is usually the "
        "scheduler address or port, a firewall between nodes, or *_SOCKET_IFNAME"
    )
    device_note = f"; {UNTESTED_SWEEP}" if smoke.target != "CPU" else ""
    if not smoke.ok or len(ranks_ok) < smoke.world:
        bad = [r for r in checks if not r.get("ok")]
        if bad:
            value = f"wrong sum on rank {bad[0].get('rank')}: {bad[0].get('got')} != {bad[0].get('expected')}"
        else:
            value = f"{len(ranks_ok)} of {smoke.world} ranks reduced: {smoke.reason}"
        return [result(ALL, "collective", CheckStatus.FAIL, value, remedy, f"{smoke.reason}{device_note}")]
    ms = statistics.median(float(r.get("allreduce_ms") or 0.0) for r in checks)
    expected = checks[0].get("expected")
    init = max(float(r.get("init_s") or 0.0) for r in checks)
    out = [
        result(
            ALL,
            "collective",
            CheckStatus.OK,
            f"AllReduce on {smoke.world} ranks: sum {expected:g} ok, {ms:.2f} ms",
            "",
            f"{checks[0].get('bytes')} bytes per rank, median of {len(checks)} ranks' medians; cluster "
            f"set-up {init:.1f} s; whole smoke test {smoke.wall_s:.1f} s ({smoke.target}){device_note}",
        )
    ]
    sweep = [r for r in smoke.records if r.get("kind") == "sweep"]
    if sweep:
        by_size: dict[int, list[float]] = {}
        for r in sweep:
            by_size.setdefault(int(r.get("bytes") or 0), []).append(float(r.get("busbw_gbs") or 0.0))
        # The slowest rank bounds a collective: per size, the minimum over ranks.
        table = {size: min(v) for size, v in sorted(by_size.items())}
        best = max(table, key=lambda s: table[s])
        out.append(
            result(
                ALL,
                "collective.busbw",
                CheckStatus.OK,
                f"{table[best]:.1f} GB/s bus bandwidth at {_bytes(best)}",
                "",
                "; ".join(f"{_bytes(s)} {bw:.2f} GB/s" for s, bw in table.items())
                + f" (busbw = algbw x 2(n-1)/n){device_note}",
            )
        )
    return out


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"
