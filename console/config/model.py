"""The inventory as the rest of the console sees it: frozen dataclasses, each default written here
only (the parser leaves a missing key to them). Built by ``inventory.load_inventory``."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from mscon.agent.policy import DEFAULT_GRACE_S
from mscon.agent.retention import KEEP_RUNS

DEVICE_TARGETS = ("GPU", "Ascend", "CPU")
TRANSPORTS = ("ssh", "local")


@dataclass(frozen=True)
class NodeSpec:
    name: str  # unique; used in log prefixes and state paths
    host: str  # as given; resolved through ~/.ssh/config like the ssh command does
    devices: int
    transport: str = "ssh"
    user: str | None = None
    port: int | None = None
    python: str | None = None  # None: python3 over SSH, the console's own interpreter locally
    identity_file: str | None = None
    address: str | None = None  # how other nodes reach this one (the scheduler binds here)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SchedulerSpec:
    port: int = 8118
    host: str | None = None  # defaults to the first node's address


@dataclass(frozen=True)
class JobSpec:
    workdir: Path  # absolute, resolved against the inventory file's folder
    script: str  # relative to workdir, and resolves inside it
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()  # extra glob patterns kept out of the workdir sync
    resume_args: tuple[str, ...] = ()  # appended to the script's args from the second attempt on
    metrics_pattern: str | None = None  # regex for log lines, named groups step, loss (and epoch)
    max_workdir_gib: float = 4.0  # a larger workdir is refused before it is packed (it goes to every node)


STANDBY_KINDS = ("auto", "joined", "imported")


@dataclass(frozen=True)
class RestartSpec:
    max_restarts: int = 0
    backoff_s: float = 2.0
    # What the next attempt's spare processes do ahead of a restart (agent/spares.py): "joined"
    # also joins their own MindSpore cluster, so a restart skips the join; "imported" only imports
    # MindSpore. "auto": joined on CPU, imported on GPU/Ascend (where a second process per device
    # holding a context and a communicator is not verified).
    standby: str = "auto"
    # After a run that ended by itself, each node keeps a joined standby cluster this long for the
    # next run of the same job (agent/keeper.py): its first attempt then starts warm. 0: none kept.
    keep_warm_s: float = 0.0

    def standby_joins(self, device_target: str) -> bool:
        return self.standby == "joined" or (self.standby == "auto" and device_target == "CPU")

    def keeps_warm(self, device_target: str) -> bool:
        """A joined standby outlives the run (only a joined one: it is what a launch waits on)."""
        return self.keep_warm_s > 0 and self.standby_joins(device_target)


@dataclass(frozen=True)
class HangSpec:
    # A rank silent this long counts as hung; None: derived from each rank's pace (policy.HangRule)
    timeout_s: float | None = None


@dataclass(frozen=True)
class ChecksSpec:
    shm_min_gib: float = 1.0


@dataclass(frozen=True)
class SshSpec:
    known_hosts: str | None = None  # None: the user's ~/.ssh/known_hosts, as ssh does
    config: str | None = None  # None: the user's ~/.ssh/config, as ssh does
    connect_timeout_s: float = 10.0
    keepalive_s: float = 5.0
    max_parallel_connects: int = 16

    @property
    def keepalive_interval_s(self) -> float:
        """The field's old name, for code written before the rename."""
        return self.keepalive_s


@dataclass(frozen=True)
class RetentionSpec:
    keep_runs: int = KEEP_RUNS  # each node keeps its newest N run folders (never a running or detached one)


@dataclass(frozen=True)
class StopSpec:
    grace_s: float = DEFAULT_GRACE_S


@dataclass(frozen=True)
class SlurmNodes:
    """``nodes: {from: slurm}``: the nodes come from the Slurm allocation at run time."""

    devices: int | None = None  # None: from the allocation (SLURM_GPUS_ON_NODE, ...)
    python: str | None = None  # defaults.python
    env: dict[str, str] = field(default_factory=dict)  # defaults.env


@dataclass(frozen=True)
class Inventory:
    path: Path
    name: str
    device_target: str
    nodes: tuple[NodeSpec, ...]
    job: JobSpec
    scheduler: SchedulerSpec = SchedulerSpec()
    restart: RestartSpec = RestartSpec()
    checks: ChecksSpec = ChecksSpec()
    ssh: SshSpec = SshSpec()
    stop: StopSpec = StopSpec()
    hang: HangSpec = HangSpec()
    slurm: SlurmNodes | None = None  # nodes from the allocation: ``nodes`` is empty until applied
    retention: RetentionSpec = RetentionSpec()

    @functools.cached_property
    def world_size(self) -> int:
        # Cached: asked per node (each node's subscription), it was O(nodes^2) at start-up, a
        # third of the console's CPU at 3,000 nodes (bench/scale.py --profile).
        return sum(n.devices for n in self.nodes)
