"""An inventory from command-line flags, as msrun, torchrun and mpirun users give their jobs:
``--hosts a,b --nproc-per-node N`` (or an MPI/DeepSpeed ``--hostfile`` of ``HOST [slots=N]`` lines),
``--device-target``, ``--python``, ``--env KEY=VALUE``, ``--master-port``; no YAML file.

It builds the same frozen ``Inventory`` as a file does (every default is the model's), and holds
values to the same domains (``domains.py``, ``limits.py``). Hosts are reached over SSH, as ``ssh
HOST`` reaches them (``~/.ssh/config`` aliases included): the local transport stays the embedded
local inventory's. Bad input raises ``AdhocError``, whose ``str()`` is one line naming the flag, or
the hostfile and line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mscon.console.config import named_files
from mscon.console.config.domains import (
    ENV_KEY_RE,
    HOST_WHAT,
    LABEL_RE,
    PY_ABS,
    PY_BARE,
    host_problem,
)
from mscon.console.config.errors import oneline
from mscon.console.config.limits import (
    MAX_DEVICES_PER_NODE,
    MAX_ENV_KEY,
    MAX_FILE_BYTES,
    MAX_HOST,
    MAX_ITEMS,
    MAX_NAME,
    MAX_NODES,
    MAX_VALUE,
    MAX_WORLD_SIZE,
)
from mscon.console.config.model import DEVICE_TARGETS, Inventory, JobSpec, NodeSpec
from mscon.console.config.scalars import describe_char, first_bad_char

ADHOC_NAME = "adhoc"  # the inventory's name (it names no file)
HOSTS_SOURCE = Path("--hosts")  # Inventory.path of a --hosts job: messages say "--hosts: ..."
HOSTFILE_FORMAT = "HOST [slots=N] per line (# comments and blank lines allowed)"
# Without --device-target: what the ranks' own script sets is what runs; preflight then assumes no
# accelerator (no device checks; the AllReduce smoke test on CPU). Give GPU or Ascend to check them.
DEFAULT_DEVICE_TARGET = "CPU"


class AdhocError(Exception):
    """A bad flag or hostfile line; ``str()`` is the one-line message shown to the user."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(oneline(f"{where}: {message}"))


@dataclass(frozen=True)
class AdhocFlags:
    """The flags as given (None: not given)."""

    hosts: str | None = None  # "a,b,c"
    hostfile: Path | None = None
    nproc_per_node: int | None = None
    device_target: str | None = None
    python: str | None = None
    env: tuple[str, ...] = ()  # "KEY=VALUE" each
    master_port: int | None = None

    @property
    def names_nodes(self) -> bool:
        """These flags describe the nodes (so no inventory file is needed, and none may be given)."""
        return self.hosts is not None or self.hostfile is not None


def device_target_arg(text: str) -> str:
    """``--device-target``'s value, any case (gpu, Gpu, GPU), as the model spells it."""
    for target in DEVICE_TARGETS:
        if text.casefold() == target.casefold():
            return target
    raise ValueError(f"expected one of {', '.join(DEVICE_TARGETS)}, got {text!r}")


def build_inventory(flags: AdhocFlags, workdir: Path, script: str, args: Sequence[str] = ()) -> Inventory:
    """The inventory the node flags describe; ``workdir`` is absolute and holds ``script``."""
    if flags.hosts is not None and flags.hostfile is not None:
        raise AdhocError("--hostfile", "give the nodes with --hosts or with --hostfile, not both")
    if flags.hostfile is not None:
        slots = read_hostfile(flags.hostfile, flags.nproc_per_node)
        source = flags.hostfile
    elif flags.hosts is not None:
        if flags.nproc_per_node is None:
            raise AdhocError("--hosts", "give the ranks per node with --nproc-per-node N")
        per_node = _nproc(flags.nproc_per_node)
        slots = [(host, per_node) for host in parse_hosts(flags.hosts)]
        source = HOSTS_SOURCE
    else:
        raise AdhocError("--hosts", "give the nodes with --hosts a,b or --hostfile FILE")
    nodes = _nodes(slots, str(source))
    inv = Inventory(
        path=source,
        name=ADHOC_NAME,
        device_target=flags.device_target or DEFAULT_DEVICE_TARGET,
        nodes=nodes,
        job=JobSpec(workdir=workdir, script=script, args=tuple(args)),
    )
    return apply_flags(inv, dataclasses.replace(flags, device_target=None))


def apply_flags(inv: Inventory, flags: AdhocFlags) -> Inventory:
    """``inv`` with the flags that also apply to an inventory file: ``--device-target``, ``--python``
    (every node's), ``--env`` (added to job.env, winning over it) and ``--master-port``."""
    if flags.device_target is not None:
        inv = dataclasses.replace(inv, device_target=flags.device_target)
    if flags.python is not None:
        python = check_python(flags.python)
        inv = dataclasses.replace(inv, nodes=tuple(dataclasses.replace(n, python=python) for n in inv.nodes))
        if inv.slurm is not None:
            inv = dataclasses.replace(inv, slurm=dataclasses.replace(inv.slurm, python=python))
    if flags.env:
        env = {**inv.job.env, **parse_env(flags.env)}
        inv = dataclasses.replace(inv, job=dataclasses.replace(inv.job, env=env))
    if flags.master_port is not None:
        if not 1 <= flags.master_port <= 65535:
            raise AdhocError("--master-port", f"expected a port in 1..65535, got {flags.master_port}")
        inv = dataclasses.replace(inv, scheduler=dataclasses.replace(inv.scheduler, port=flags.master_port))
    return inv


def parse_hosts(text: str) -> list[str]:
    """``a,b,c`` (spaces around commas allowed), each a host as an inventory's ``host`` may be."""
    hosts = [h.strip() for h in text.split(",")]
    if not any(hosts):
        raise AdhocError("--hosts", "expected a comma-separated list of hosts, e.g. --hosts node-a,node-b")
    for host in hosts:
        problem = host_problem_text(host)
        if problem:
            raise AdhocError("--hosts", problem)
    return hosts


def host_problem_text(host: str) -> str:
    """What is wrong with ``host`` as a node's host, or "" if nothing."""
    if not host:
        return "an empty host name (two commas in a row, or a trailing comma?)"
    if len(host) > MAX_HOST:
        return f"host too long: {len(host)} characters (at most {MAX_HOST})"
    problem = host_problem(host)
    if problem is None:
        return f"expected {HOST_WHAT}, got {host!r}"
    return f"{problem}: {host!r}" if problem else ""


def read_hostfile(path: Path, default_slots: int | None) -> list[tuple[str, int]]:
    """``(host, ranks)`` per line of an MPI/DeepSpeed hostfile: ``HOST [slots=N]``; a line without
    ``slots=`` takes ``--nproc-per-node``. Errors name the file and line."""
    try:
        # A regular file of bounded size: a FIFO or /dev/zero given as --hostfile must not hold mscon.
        text = named_files.read_bounded(path, MAX_FILE_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise AdhocError(str(path), "not UTF-8 text") from None
    except ValueError as exc:
        raise AdhocError("--hostfile", str(exc)) from None
    default = _nproc(default_slots) if default_slots is not None else None
    out: list[tuple[str, int]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        where = f"{path}:{lineno}"
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        host, rest = words[0], words[1:]
        problem = host_problem_text(host)
        if problem:
            raise AdhocError(where, problem)
        slots = None
        for word in rest:
            key, eq, value = word.partition("=")
            if key != "slots" or not eq:
                raise AdhocError(where, f"unexpected {word!r}: expected {HOSTFILE_FORMAT}")
            if slots is not None:
                raise AdhocError(where, "slots= given twice")
            if not (value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_DEVICES_PER_NODE):
                raise AdhocError(where, f"slots: expected 1..{MAX_DEVICES_PER_NODE}, got {value!r}")
            slots = int(value)
        if slots is None:
            if default is None:
                raise AdhocError(where, f"{host}: no slots=N on this line and no --nproc-per-node")
            slots = default
        out.append((host, slots))
    if not out:
        raise AdhocError(str(path), f"no hosts in it (expected {HOSTFILE_FORMAT})")
    return out


def parse_env(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` each (the value may be empty, and may hold '='); names and values as an
    inventory's ``env`` takes them."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise AdhocError(
                "--env", f"expected KEY=VALUE, got {item!r} (the laptop's environment is not sent)"
            )
        if not ENV_KEY_RE.fullmatch(key) or len(key) > MAX_ENV_KEY:
            raise AdhocError(
                "--env", f"expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*), got {key[:60]!r}"
            )
        if key in out:
            raise AdhocError("--env", f"{key} given twice")
        if len(value) > MAX_VALUE:
            raise AdhocError("--env", f"{key}: value too long: {len(value)} characters (at most {MAX_VALUE})")
        bad = first_bad_char(value, "\t\n")
        if bad is not None:
            raise AdhocError("--env", f"{key}: value contains {describe_char(bad)}")
        out[key] = value
    if len(out) > MAX_ITEMS:
        raise AdhocError("--env", f"too many variables: {len(out)} (at most {MAX_ITEMS})")
    return out


def check_python(value: str) -> str:
    """``--python``: as an inventory's ``python``, an absolute path or a bare command name."""
    if PY_ABS.fullmatch(value) or PY_BARE.fullmatch(value):
        return value
    raise AdhocError(
        "--python",
        "expected an absolute path or a bare command name (letters, digits, and . _ + - @ = , ~ /; "
        f"no spaces, quotes or shell characters), got {value!r}",
    )


def _nproc(value: int) -> int:
    if not 1 <= value <= MAX_DEVICES_PER_NODE:
        raise AdhocError("--nproc-per-node", f"expected 1..{MAX_DEVICES_PER_NODE}, got {value}")
    return value


def _nodes(slots: list[tuple[str, int]], where: str) -> tuple[NodeSpec, ...]:
    if len(slots) > MAX_NODES:
        raise AdhocError(where, f"too many nodes: {len(slots)} (at most {MAX_NODES})")
    world = sum(n for _, n in slots)
    if world > MAX_WORLD_SIZE:
        raise AdhocError(where, f"the world size {world} exceeds {MAX_WORLD_SIZE} ranks")
    nodes: list[NodeSpec] = []
    seen: dict[str, str] = {}
    for i, (host, devices) in enumerate(slots):
        # The host names its node where it can (log prefixes, folders); an IPv6 literal cannot.
        name = host if LABEL_RE.fullmatch(host) and len(host) <= MAX_NAME else f"node{i}"
        folded = name.casefold()  # node names become folder names: compare them as such
        if folded in seen:
            raise AdhocError(where, f"duplicate host {host!r} (each node once, with its ranks)")
        seen[folded] = host
        nodes.append(NodeSpec(name=name, host=host, devices=devices))
    return tuple(nodes)
