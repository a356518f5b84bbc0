"""The node checks conversation: each node's agent runs its own checks (``agent/checks/``) on request
and answers with one ``CheckResult`` each and ``ChecksDone``; its clock is read in rounds of its own
first. Each result is reported as soon as it comes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mscon.agent.protocol import CheckResult, ChecksDone, RunChecks, standby_port
from mscon.console.config.inventory import Inventory
from mscon.console.engine.events import CheckReported
from mscon.console.engine.session import ClusterSession, NodeLink
from mscon.console.preflight import checks as cc
from mscon.console.preflight.router import Lost, Router, next_answer

_CLOCK_PROBES = 3  # readings per node; the one with the shortest round trip is kept
_NODE_TIMEOUT_S = 20.0  # each subprocess of a node check
# The keys the launcher sets per rank: not part of the environment the checks should look at.
_LAUNCHER_KEYS = frozenset(
    {
        "MS_ROLE",
        "MS_NODE_ID",
        "RANK_ID",
        "DEVICE_ID",
        "LOCAL_RANK",
        "MS_SCHED_HOST",
        "MS_SCHED_PORT",
        "MS_WORKER_NUM",
        "RANK_SIZE",
    }
)


@dataclass(slots=True)
class NodeChecks:
    """One preflight's conversation with the nodes about their checks, and what it found."""

    session: ClusterSession
    router: Router
    inv: Inventory
    job_args: tuple[str, ...]
    sched: str  # the scheduler's address (MS_SCHED_HOST)
    deadline: float  # time.monotonic() by which every node has answered
    names: tuple[str, ...]  # the checks asked for, without "clock"
    read_clock: bool
    shm_path: str | None  # PreflightOptions.shm_path
    report: Callable[[CheckReported], None]
    by_node: dict[str, dict[str, CheckReported]] = field(default_factory=dict)
    clocks: dict[str, cc.ClockSample] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)  # node -> why its conversation ended

    async def node(self, index: int, link: NodeLink) -> None:
        params = self._params(index, link)
        try:
            if self.read_clock:
                await self._clock(link.name, params)
            if self.names:
                for r in await self._ask(link.name, RunChecks(names=self.names, params=params)):
                    self.by_node.setdefault(link.name, {})[r.name] = r
                    self.report(r)
        except Lost as exc:
            self.lost[link.name] = str(exc)

    def _params(self, index: int, link: NodeLink) -> dict[str, Any]:
        inv, plan = self.inv, link.plan
        worker = plan.procs[-1]  # every node runs at least one rank
        env = {k: v for k, v in worker.env.items() if k not in _LAUNCHER_KEYS}
        return {
            "device_target": inv.device_target,
            "devices": plan.node.devices,
            "python": plan.python,
            "env": env,
            "shm_path": plan.node.env.get("MSCON_SHM_PATH") or self.shm_path or "/dev/shm",
            "shm_min_gib": inv.checks.shm_min_gib,
            # Where the workdir is unpacked and the run's logs go: under the node's cache folder.
            "workdir": link.transport.cache_root if link.transport.syncs_workdir else str(inv.job.workdir),
            "checkpoint_dir": _arg_value(self.job_args, "--checkpoint-dir"),
            "sched_port": inv.scheduler.port,
            "standby_ports": (
                [standby_port(inv.scheduler.port, a) for a in (1, 2)]
                if inv.restart.standby_joins(inv.device_target)
                else []
            ),
            "sched_host": self.sched,
            "is_first": index == 0,
            "timeout_s": _NODE_TIMEOUT_S,
            "nodes": len(self.session.links),
            "world_size": inv.world_size,
        }

    async def _ask(self, node: str, msg: RunChecks) -> list[CheckReported]:
        """One RunChecks round: its results, up to ChecksDone."""
        q = self.router.queue(node, "checks")
        if not await self.session.send(node, msg):
            raise Lost("the node's agent is not connected")
        out = []
        while True:
            _, answer = await next_answer(q, self.deadline)
            if isinstance(answer, ChecksDone):
                return out
            if isinstance(answer, CheckResult):
                out.append(
                    CheckReported(
                        0,
                        node,
                        answer.name,
                        cc.status_of(answer.status),
                        answer.value,
                        answer.remedy,
                        answer.detail,
                    )
                )

    async def _clock(self, node: str, params: dict[str, Any]) -> None:
        samples = []
        q = self.router.queue(node, "checks")
        for _ in range(_CLOCK_PROBES):
            sent = time.time_ns()
            if not await self.session.send(
                node, RunChecks(names=("clock",), params={**params, "console_time_ns": sent})
            ):
                raise Lost("the node's agent is not connected")
            received, value = 0, None
            while True:
                ts, answer = await next_answer(q, self.deadline)
                if isinstance(answer, CheckResult) and answer.name == "clock":
                    received, value = ts, answer.value
                elif isinstance(answer, ChecksDone):
                    break
            if value is not None and value.strip().isdigit():
                samples.append(cc.ClockSample(int(value), sent, received))
        if samples:
            self.clocks[node] = cc.best_sample(samples)


def _arg_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
