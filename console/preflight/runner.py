"""Preflight: every check on every node at once, before any rank starts (``mscon check``, and the
quick ones before ``mscon run``).

It runs inside the Supervisor, over its ClusterSession (``RunOptions.preflight``): after the agents
are up and the scheduler's address is known, before the first attempt. The nodes run their own
checks (``agent/checks/``) on request; the console adds what only it can see (``checks``):
one MindSpore version and driver everywhere, the clocks' skew, a TCP mesh between the nodes that
includes the scheduler's address, the agents' protocol, the job's arguments through the trainer's
own checks, and (``mscon check``) a real AllReduce over every rank, launched like a job. Each result
is a ``CheckReported`` event as soon as it is known, and ``ChecksFinished`` ends them.

While it runs, the session's inbox is swapped for a router (``router``) that takes the nodes'
answers to the checks and passes everything else on to the supervisor, which keeps serving Ctrl-C
meanwhile. This module orchestrates and decides; each conversation has its own: the node checks
(``nodes``), the TCP mesh (``mesh``), the job's arguments (``lint``), the smoke test (``collective``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mscon.agent import checks as node_checks
from mscon.agent.layout import LOGS_DIR
from mscon.agent.protocol import PROTOCOL_VERSION
from mscon.console.config.inventory import Inventory
from mscon.console.engine import exit_codes
from mscon.console.engine.bus import EventBus
from mscon.console.engine.events import CheckReported, ChecksFinished, CheckStatus, Event, JobState
from mscon.console.engine.plan import NodePlan
from mscon.console.engine.session import ClusterSession
from mscon.console.preflight import checks as cc
from mscon.console.preflight import collective, lint, mesh
from mscon.console.preflight.collective import NestedRun
from mscon.console.preflight.nodes import NodeChecks
from mscon.console.preflight.router import Router


@dataclass(frozen=True, slots=True)
class JobView:
    """What preflight needs to know of the run it checks."""

    inv: Inventory
    plans: tuple[NodePlan, ...]
    script: str
    args: tuple[str, ...]
    args_given: bool  # the arguments came after -- (else they are the inventory's job.args)
    run_id: str
    accept_new_host_keys: bool


class RunHost(Protocol):
    """The run preflight serves (the supervisor): its job, its events, and a way to launch the
    smoke test. Preflight never reaches into the supervisor itself."""

    @property
    def job(self) -> JobView: ...

    @property
    def attempt_no(self) -> int: ...

    def emit(self, ev: Event) -> None: ...

    def nested_run(self, inv: Inventory, run_id: str, logs_root: Path, bus: EventBus) -> NestedRun: ...


_QUICK_WAIT_S = 45.0  # for all of a node's answers
_FULL_WAIT_S = 120.0  # importing MindSpore on a busy node can take a minute (its own limit is 60 s)
# A failure of one of these makes the smoke test pointless: it could only hang or repeat it.
_BLOCKS_COLLECTIVE = ("python", "mindspore", "port", "mesh", "sched")


@dataclass(frozen=True, slots=True)
class PreflightOptions:
    quick: bool = False  # the cheap subset (before mscon run), or every check (mscon check)
    collective: bool = False  # the AllReduce smoke test over every rank
    sweep: bool | None = None  # its bandwidth sweep; None: on GPU/Ascend, off on CPU
    skip: tuple[str, ...] = ()  # --skip-check: not run, not counted, recorded
    checks_only: bool = False  # mscon check: the run ends after the checks
    shm_path: str | None = None  # MSCON_SHM_PATH: where shared memory is checked (a node's env wins)
    smoke_timeout_s: float = 300.0
    smoke_logs_root: Path = Path(LOGS_DIR)  # a failed smoke test keeps its logs here


@dataclass(frozen=True, slots=True)
class Verdict:
    proceed: bool  # go on to the first attempt
    status: JobState = JobState.SUCCEEDED
    exit_code: int = exit_codes.OK
    reason: str = ""


def known_check(name: str) -> bool:
    """A name --skip-check accepts: a check, a group (gpu, npu, limits) or one of their results."""
    top = name.split(".", 1)[0]
    return top in node_checks.NODE_CHECKS or top in cc.CONSOLE_CHECKS or top in ("gpu", "npu")


def all_check_names() -> tuple[str, ...]:
    return tuple(node_checks.NODE_CHECKS) + cc.CONSOLE_CHECKS


class Preflight:
    def __init__(self, options: PreflightOptions) -> None:
        self.options = options
        self.results: list[CheckReported] = []
        self.finished: ChecksFinished | None = None
        self.wall_s = 0.0

    # ------------------------------------------------------------ what the supervisor calls

    def unreachable(self, sup: RunHost, session: ClusterSession) -> None:
        """The session could not open every node: each one's reach error (or protocol mismatch) as
        a result, so the table shows what the one-line errors say."""
        results = []
        for link in session.links.values():
            if link.hello is not None:
                results.append(cc.protocol_result(link.name, link.hello.protocol, PROTOCOL_VERSION))
            elif link.error:
                results.append(cc.reach_result(link.name, link.transport.kind, link.error))
        for r in results:
            self._emit(sup, r)
        self._finish(sup)

    async def run(self, sup: RunHost, session: ClusterSession, sched: str) -> Verdict:
        t0 = time.monotonic()
        router = Router(session.inbox)
        wait = _QUICK_WAIT_S if self.options.quick else _FULL_WAIT_S
        nodes = NodeChecks(
            session,
            router,
            sup.job.inv,
            sup.job.args,
            sched,
            time.monotonic() + wait,
            names=self._names(),
            # "clock" has its own round trips: mixed with slow checks its reading would be late.
            read_clock=not self._skipped("clock"),
            shm_path=self.options.shm_path,
            report=functools.partial(self._emit, sup),
        )
        with session.diverted(router):
            await self._checks(sup, nodes)
        if self.options.collective and not self._skipped("collective"):
            blocked = [
                r for r in self.results if r.status is CheckStatus.FAIL and r.name in _BLOCKS_COLLECTIVE
            ]
            if blocked:
                why = ", ".join(f"{r.node}: {r.name}" for r in blocked)
                self._emit(
                    sup,
                    cc.result(
                        cc.ALL, "collective", CheckStatus.NA, "not run: fix the failures first", "", why
                    ),
                )
            else:
                found = await collective.smoke_test(
                    sup.job.inv,
                    sup.job.run_id,
                    sup.nested_run,
                    self._sweep_max_bytes(sup.job.inv.device_target),
                    self.options.smoke_timeout_s,
                    self.options.smoke_logs_root,
                )
                for r in found:
                    self._emit(sup, r)
        self.wall_s = time.monotonic() - t0
        self._finish(sup)
        return self._verdict(nodes.lost)

    # ------------------------------------------------------------ the checks

    async def _checks(self, sup: RunHost, nodes: NodeChecks) -> None:
        """Every node's checks, the mesh and the job's arguments at once, then what only the
        answers of all the nodes together tell."""
        session = nodes.session
        links = [link for link in session.links.values() if link.open]
        for link in links:
            assert link.hello is not None
            self._emit(sup, cc.protocol_result(link.name, link.hello.protocol, PROTOCOL_VERSION))
        targets = mesh.targets_of(session, nodes.sched)
        work = [nodes.node(i, link) for i, link in enumerate(links)]
        probing = self._mesh(sup, nodes, [link.name for link in links], targets)
        linting = self._lint(sup)
        *_, probes, config = await asyncio.gather(*work, probing, linting)
        if config is not None:
            self._emit(sup, config)
        for name, status in (
            ("mindspore", CheckStatus.FAIL),
            ("gpu.driver", CheckStatus.WARN),
            ("npu.driver", CheckStatus.WARN),
        ):
            per_node = {n: found[name] for n, found in nodes.by_node.items() if name in found}
            if per_node and len(session.links) > 1:
                self._emit(sup, cc.same_version(name, per_node, status))
        for r in cc.clock_results(nodes.clocks):
            self._emit(sup, r)
        if probes is not None:
            names = [link.name for link in links]
            self._emit(sup, cc.mesh_result(names, targets, probes))
            first = sup.job.plans[0].node.name
            port = nodes.by_node.get(first, {}).get("port")
            self._emit(sup, cc.sched_result(nodes.sched, sup.job.inv.scheduler.port, first, probes, port))
        for node, why in nodes.lost.items():
            self._emit(sup, cc.result(node, "checks", CheckStatus.FAIL, why, "see the node's error above"))

    def _names(self) -> tuple[str, ...]:
        names = node_checks.QUICK_CHECKS if self.options.quick else node_checks.NODE_CHECKS
        return tuple(n for n in names if n != "clock" and not self._skipped(n))

    async def _mesh(
        self, sup: RunHost, nodes: NodeChecks, names: list[str], targets: dict[str, tuple[str, int]]
    ) -> dict[str, list[dict] | None] | None:
        if self._skipped("mesh") and self._skipped("sched"):
            return None
        avoid = sup.job.inv.scheduler.port
        return await mesh.probe(
            nodes.session, nodes.router, nodes.deadline, names, targets, avoid, _FULL_WAIT_S
        )

    async def _lint(self, sup: RunHost) -> CheckReported | None:
        if self._skipped("config"):
            return None
        return await lint.lint(sup.job.inv, sup.job.script, sup.job.args, sup.job.args_given)

    def _sweep_max_bytes(self, target: str) -> int:
        """The largest message of the bandwidth sweep: 0 (none), 1 MiB on CPU (MCCL over TCP, one
        graph compile per size), 256 MiB on devices."""
        on_device = target != "CPU"
        wanted = on_device if self.options.sweep is None else self.options.sweep
        if not wanted or self._skipped("collective.busbw"):
            return 0
        return collective.DEVICE_SWEEP_MAX_BYTES if on_device else collective.CPU_SWEEP_MAX_BYTES

    # ------------------------------------------------------------ results

    def _skipped(self, name: str) -> bool:
        return cc.skipped(name, self.options.skip)

    def _emit(self, sup: RunHost, r: CheckReported) -> None:
        if self._skipped(r.name):
            return
        r = dataclasses.replace(r, attempt=sup.attempt_no)
        self.results.append(r)
        sup.emit(r)

    def _finish(self, sup: RunHost) -> None:
        failed = tuple(f"{r.node}: {r.name}" for r in self.results if r.status is CheckStatus.FAIL)
        self.finished = ChecksFinished(
            sup.attempt_no, failed=failed, skipped=self.options.skip, ts_ns=time.time_ns()
        )
        sup.emit(self.finished)

    def _verdict(self, lost: dict[str, str]) -> Verdict:
        fails = [r for r in self.results if r.status is CheckStatus.FAIL]
        warns = [r for r in self.results if r.status is CheckStatus.WARN]
        if lost:
            node, why = next(iter(lost.items()))
            return Verdict(False, JobState.UNREACHABLE, exit_codes.UNREACHABLE, f"{node}: {why}")
        if fails:
            shown = "; ".join(
                f"{r.node}: {r.name} ({r.value})" if r.value else f"{r.node}: {r.name}" for r in fails
            )
            return Verdict(False, JobState.FAILED, exit_codes.PREFLIGHT, f"preflight failed: {shown}")
        if not self.options.checks_only:
            return Verdict(True)
        n = len(self.results)
        said = f"{n} checks passed" + (f", {len(warns)} with a warning" if warns else "")
        return Verdict(False, JobState.SUCCEEDED, exit_codes.OK, said)
