"""The nodes of a Slurm allocation: ``mscon run --slurm`` or ``nodes: {from: slurm}``.

Read from the environment Slurm gives a job (``salloc``, ``sbatch``): ``SLURM_JOB_ID``, the node
list ``SLURM_JOB_NODELIST`` expanded by Slurm itself (``scontrol show hostnames``, never a parser
of our own), and the devices per node. Every host name is checked like an inventory's ``host``.
Whatever is missing or malformed is a :class:`SlurmError` whose ``str()`` is one line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from mscon.console.config.domains import LABEL_RE, host_problem
from mscon.console.config.inventory import Inventory, NodeSpec, SlurmNodes, oneline
from mscon.console.config.limits import MAX_DEVICES_PER_NODE, MAX_NAME, MAX_NODES, MAX_WORLD_SIZE

SLURM_TRANSPORT = "slurm"  # NodeSpec.transport of nodes found here
SCONTROL_TIMEOUT_S = 30.0
_JOB_ID = re.compile(r"[0-9]{1,18}", re.ASCII)
# What Slurm writes in a node list: names, ranges in brackets, commas. Nothing a shell or
# scontrol could read as an option (it goes through the environment, not the command line).
_NODELIST = re.compile(r"[A-Za-z0-9_.\[\],-]+", re.ASCII)
_MAX_NODELIST = 1 << 16
_TASKS = re.compile(r"([0-9]{1,6})(?:\(x([0-9]{1,6})\))?", re.ASCII)


class SlurmError(Exception):
    """No usable allocation; ``str()`` is one line saying why."""

    def __init__(self, message: str) -> None:
        super().__init__(oneline(message))


@dataclass(frozen=True, slots=True)
class Allocation:
    job_id: str
    hosts: tuple[str, ...]  # in Slurm's order; the first runs MindSpore's scheduler
    devices: int  # ranks per node
    devices_from: str  # where that number came from, for messages


def _env(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _positive(name: str, value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_DEVICES_PER_NODE:
        raise SlurmError(f"{name}={value[:40]!r}: expected a device count in 1..{MAX_DEVICES_PER_NODE}")
    return int(value)


def _uniform_tasks(value: str) -> int | None:
    """``SLURM_TASKS_PER_NODE`` (``2(x3)`` or ``2,2``): the count when every node has the same."""
    counts = set()
    for part in value.split(","):
        m = _TASKS.fullmatch(part)
        if m is None:
            return None
        counts.add(int(m.group(1)))
    return counts.pop() if len(counts) == 1 else None


def devices_per_node(env: Mapping[str, str], given: int | None, fallback: int | None) -> tuple[int, str]:
    """The inventory's ``nodes.devices`` first (explicit), then what the allocation says: GPUs on
    the node, then tasks per node; then the listed nodes' common count (``--slurm`` on a listed
    inventory)."""
    if given is not None:
        return given, "nodes.devices"
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE"):
        found = _env(env, name)
        if found is not None:
            return _positive(*found), name
    found = _env(env, "SLURM_TASKS_PER_NODE")
    if found is not None and (count := _uniform_tasks(found[1])) is not None:
        return _positive(found[0], str(count)), found[0]
    if fallback is not None:
        return fallback, "the inventory's nodes"
    raise SlurmError(
        "cannot tell how many ranks to start per node: the allocation sets none of SLURM_GPUS_ON_NODE, "
        "SLURM_NTASKS_PER_NODE (salloc/sbatch --ntasks-per-node=N or --gpus-per-node=N), "
        "and the inventory gives no nodes: {from: slurm, devices: N}"
    )


def expand_nodelist(nodelist: str, env: Mapping[str, str]) -> tuple[str, ...]:
    """Slurm's own expansion (``scontrol show hostnames``); the list travels in the environment."""
    # Slurm 22.05's scontrol reads SLURM_NODELIST, newer ones SLURM_JOB_NODELIST: both are set.
    child_env = {**env, "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist}
    done = _slurm_cmd(["scontrol", "show", "hostnames"], child_env)
    hosts = tuple(line.strip() for line in done.stdout.splitlines() if line.strip())
    if done.returncode != 0 or not hosts:  # 22.05 says "Invalid hostlist" on stderr and exits 0
        raise SlurmError(
            f"scontrol show hostnames failed for the node list {nodelist[:200]!r}: {_last_line(done)}"
        )
    return hosts


def _slurm_cmd(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not on PATH: run mscon on a node of the Slurm cluster") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:3])} took longer than {SCONTROL_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise SlurmError(f"cannot run {argv[0]}: {exc}") from None


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1][:300] if lines else f"exit status {done.returncode}"


def _check_running(job_id: str, env: Mapping[str, str]) -> None:
    """A stale environment (the allocation ended, or a job id copied by hand) is a usage error
    here, not a failed srun later."""
    done = _slurm_cmd(["squeue", "-h", "-j", job_id, "-o", "%T"], env)
    state = done.stdout.strip()
    if done.returncode != 0 or not state:
        raise SlurmError(f"Slurm job {job_id} (SLURM_JOB_ID) is not known to Slurm: {_last_line(done)}")
    if state != "RUNNING":
        raise SlurmError(f"Slurm job {job_id} (SLURM_JOB_ID) is {state}, not RUNNING")


def _check_host(host: str) -> str:
    problem = host_problem(host)
    if problem is None or problem or not LABEL_RE.fullmatch(host) or len(host) > MAX_NAME:
        raise SlurmError(
            f"Slurm node name {host[:80]!r} is not usable as a host and node name "
            f"([A-Za-z0-9._-], not starting with '-' or '.', at most {MAX_NAME} characters)"
        )
    return host


def discover(env: Mapping[str, str], given: int | None = None, fallback: int | None = None) -> Allocation:
    """The allocation this process runs in; ``SlurmError`` when there is none or it is unusable."""
    job = _env(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if job is None:
        raise SlurmError(
            "no Slurm allocation: SLURM_JOB_ID is not set (run inside salloc or an sbatch script)"
        )
    if not _JOB_ID.fullmatch(job[1]):
        raise SlurmError(f"{job[0]}={job[1][:40]!r}: not a Slurm job id")
    found = _env(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if found is None:
        raise SlurmError(f"Slurm job {job[1]}: SLURM_JOB_NODELIST is not set")
    name, nodelist = found
    if len(nodelist) > _MAX_NODELIST or not _NODELIST.fullmatch(nodelist):
        raise SlurmError(f"{name}={nodelist[:80]!r}: not a Slurm node list")
    _check_running(job[1], env)
    hosts = tuple(_check_host(h) for h in expand_nodelist(nodelist, env))
    if len(hosts) > MAX_NODES:
        raise SlurmError(f"the allocation has {len(hosts)} nodes; mscon drives at most {MAX_NODES}")
    seen: set[str] = set()
    for h in hosts:
        if h.casefold() in seen:
            raise SlurmError(f"the node list names {h!r} twice")
        seen.add(h.casefold())
    devices, source = devices_per_node(env, given, fallback)
    if devices * len(hosts) > MAX_WORLD_SIZE:
        raise SlurmError(
            f"{len(hosts)} nodes x {devices} ranks exceeds the world size limit {MAX_WORLD_SIZE}"
        )
    return Allocation(job_id=job[1], hosts=hosts, devices=devices, devices_from=source)


def _template(inv: Inventory) -> tuple[SlurmNodes, int | None]:
    """What every allocated node gets (python, env) and the inventory's device count fallback."""
    if inv.slurm is not None:
        return inv.slurm, None
    # --slurm on an inventory that lists nodes: their shared settings carry over (they are the
    # inventory's defaults); settings that differ per node cannot be mapped onto Slurm's nodes.
    pythons = {n.python for n in inv.nodes}
    envs = {tuple(sorted(n.env.items())) for n in inv.nodes}
    if len(pythons) > 1 or len(envs) > 1:
        what = "python" if len(pythons) > 1 else "env"
        raise SlurmError(
            f"{inv.path}: --slurm: the inventory's nodes differ in {what}; put it in defaults "
            "(every node of the allocation gets the same) or use nodes: {from: slurm}"
        )
    devices = {n.devices for n in inv.nodes}
    first = inv.nodes[0]
    return SlurmNodes(python=first.python, env=dict(first.env)), devices.pop() if len(devices) == 1 else None


def apply_allocation(inv: Inventory, env: Mapping[str, str] | None = None) -> Inventory:
    """``inv`` with its nodes replaced by the allocation's (reached through srun)."""
    env = os.environ if env is None else env
    template, fallback = _template(inv)
    alloc = discover(env, template.devices, fallback)
    nodes = tuple(
        NodeSpec(
            name=host,
            host=host,
            devices=alloc.devices,
            transport=SLURM_TRANSPORT,
            python=template.python,
            env=dict(template.env),
        )
        for host in alloc.hosts
    )
    return dataclasses.replace(inv, nodes=nodes, slurm=dataclasses.replace(template, devices=alloc.devices))
