"""From an inventory to what each node's agent must launch: ranks, the scheduler, their env.

Ranks are launched the way msrun does it, but by our agent, so that it owns every process:
MindSpore's dynamic-cluster variables plus the RANK_ID/DEVICE_ID/RANK_SIZE that scripts read.
"""

from __future__ import annotations

import posixpath
import sys
from dataclasses import dataclass, replace

from mscon.agent import rank_env
from mscon.agent.policy import PolicyConfig
from mscon.agent.protocol import SCHEDULER_RANK, ProcSpec, rank_name
from mscon.console.config.inventory import Inventory, NodeSpec
from mscon.console.engine.events import RunStarted


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: NodeSpec
    python: str
    procs: tuple[ProcSpec, ...]


# MindSpore's cluster timers, in whole seconds: a worker that registered before the last one learns
# that the cluster is complete at its next heartbeat, and the scheduler retries its finalize, each
# every few seconds by default. The local default job, launch to exit: 12.7-18.2 s with MindSpore's
# defaults, 7.3-8.3 s with 1 s (3 runs each; the cluster join alone, bench/warm_start.py: 4.68 ->
# 3.92 s median). The job's or a node's env may set its own.
MINDSPORE_TIMERS = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "1"}


def node_python(node: NodeSpec) -> str:
    if node.python:
        return node.python
    return sys.executable if node.transport == "local" else "python3"


def with_scheduler(spec: ProcSpec, sched_ip: str) -> ProcSpec:
    """MS_SCHED_HOST is known only once the nodes are reached (it must be an IP: see supervisor)."""
    return replace(spec, env={**spec.env, "MS_SCHED_HOST": sched_ip})


def build_plan(inv: Inventory, script: str, args: tuple[str, ...]) -> tuple[NodePlan, ...]:
    """One NodePlan per node; global ranks are numbered node by node, in inventory order."""
    world = inv.world_size
    plans = []
    first_rank = 0
    for index, node in enumerate(inv.nodes):
        python = node_python(node)
        argv = (python, script, *args)
        path_dir = posixpath.dirname(python)
        common = {
            **MINDSPORE_TIMERS,
            **node.env,
            **inv.job.env,
            "MS_SCHED_PORT": str(inv.scheduler.port),
            "MS_WORKER_NUM": str(world),
            "RANK_SIZE": str(world),
            "DEVICE_TARGET": inv.device_target,
            "PYTHONUNBUFFERED": "1",
        }
        if path_dir:
            # Non-interactive SSH reads no login files; scripts and msrun-style helpers find
            # `python` on PATH, so the interpreter's folder goes first.
            common[rank_env.PATH_PREPEND] = path_dir
        procs = []
        if index == 0:
            procs.append(
                ProcSpec(
                    name=rank_name(SCHEDULER_RANK),
                    rank=SCHEDULER_RANK,
                    local_rank=-1,
                    argv=argv,
                    env={**common, "MS_ROLE": "MS_SCHED"},
                )
            )
        for local in range(node.devices):
            rank = first_rank + local
            env = {
                **common,
                "MS_ROLE": "MS_WORKER",
                "MS_NODE_ID": str(rank),
                "RANK_ID": str(rank),
                "DEVICE_ID": str(local),
                "LOCAL_RANK": str(local),
            }
            procs.append(ProcSpec(name=rank_name(rank), rank=rank, local_rank=local, argv=argv, env=env))
        plans.append(NodePlan(node=node, python=python, procs=tuple(procs)))
        first_rank += node.devices
    return tuple(plans)


def policy_config(
    plans: tuple[NodePlan, ...],
    max_restarts: int,
    backoff_s: float,
    grace_s: float,
    hang_timeout_s: float | None,
    operator_wait_s: float | None,
) -> PolicyConfig:
    """The run's policy for these plans: their nodes, and their workers (the scheduler is none)."""
    return PolicyConfig(
        nodes=tuple(p.node.name for p in plans),
        workers={s.name: p.node.name for p in plans for s in p.procs if not s.is_scheduler},
        max_restarts=max_restarts,
        backoff_s=backoff_s,
        grace_s=grace_s,
        hang_timeout_s=hang_timeout_s,
        can_reconnect=True,
        operator_wait_s=operator_wait_s,
    )


def run_started(
    inv: Inventory, plans: tuple[NodePlan, ...], run_id: str, logs_dir: str, max_restarts: int
) -> RunStarted:
    """The event that opens a run (started or attached to): what it runs where, and where its logs go."""
    return RunStarted(
        attempt=0,
        run_id=run_id,
        inventory=str(inv.path),
        nodes=tuple(p.node.name for p in plans),
        world_size=inv.world_size,
        hosts=tuple(p.node.host for p in plans),
        logs_dir=logs_dir,
        max_restarts=max_restarts,
    )
