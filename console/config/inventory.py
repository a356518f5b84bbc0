"""Inventory files: YAML in, frozen dataclasses out, or one error naming file:line:col and field.

``load_inventory`` raises nothing but ``InventoryError``, whose ``str()`` is always one line:
``FILE:LINE:COL: FIELD: MESSAGE`` (``FILE: FIELD: MESSAGE`` where no position applies).

Schema (``*`` = required; a key left out takes its field's default in the dataclasses below,
written there only; brackets say what a missing key means where that is not a plain value):

    name*            a label: [A-Za-z0-9_][A-Za-z0-9._-]*, at most 64 characters
    device_target*   GPU | Ascend | CPU
    defaults         transport, user, port, python, identity_file, env: applied to every node
    nodes*           1..16384 mappings, or {from: slurm, devices [from the allocation]: 1..1024}:
                     the nodes of the Slurm allocation, found at run time (console/config/slurm.py);
                     defaults' python and env apply to each, its transport is srun
      host*          hostname, IPv4/IPv6 literal or ssh-config alias ([A-Za-z0-9._-], not
                     starting with '-' or '.'), at most 255 characters
      devices*       1..1024; the world size (their sum) is at most 131072
      name [host]    a label as above, at most 64 characters, unique ignoring case
      transport      ssh | local; a local node must be the only node
      user           a login name: [A-Za-z_][A-Za-z0-9._-]*[$]?, at most 32 characters
      port           1..65535
      python         an absolute path or a bare command name, without spaces or shell characters
      identity_file  a path (no control characters, not starting with '-'); if it exists, a
                     regular file of at most 1 MiB (named_files.py: checked before it is read)
      address        how other nodes reach this one: an IP literal or an RFC 1123 hostname
      env            NAME: value, NAME = [A-Za-z_][A-Za-z0-9_]*, values without NUL/control chars
    scheduler        port 1..65535; host [the first node's address]: like address
    job*             workdir [the inventory's folder]: an existing directory, synced to the nodes
                     script*: a file inside workdir, given relative to it (symlinks resolved)
                     args, resume_args (appended from the second attempt on), exclude: lists
                     (exclude: .gitignore-style patterns, as the workdir's .gitignore files);
                     max_workdir_gib > 0: a larger workdir is refused before it is packed
                     env: as a node's env; metrics: {pattern: a regex with named groups
                     step and loss, optionally epoch}
    restart          max_restarts 0..1000, backoff_s 0..600 (waited only after a failure before any step);
                     standby auto|joined|imported; keep_warm_s 0..86400: a joined standby kept
                     after the run for the next run of the job (agent/keeper.py)
    hang             timeout_s 5..86400: seconds without output before a rank counts as hung
    checks           shm_min_gib 0..1024
    ssh              known_hosts, config (paths, relative to the inventory's folder; if they
                     exist, regular files of at most 16 MiB and 1 MiB);
                     connect_timeout_s (0, 600]; keepalive_s 1..300 (old name:
                     keepalive_interval_s); max_parallel_connects 1..1024
    stop             grace_s 0..600
    retention        keep_runs 0..100000: each node's newest run folders kept (never a running or
                     detached run; agent/retention.py)

YAML: the file must be a regular file of at most 4 MiB, UTF-8 without NUL bytes, one document
nested at most 32 deep, with at most 400,000 values after expanding aliases (billion laughs).
Plain scalars follow YAML 1.2's core schema; those YAML 1.1 would read differently are refused
where a number is expected (010, 0x1f, 1:20, 1_000), and read as the text written where a
string is expected (so ``GLOG_v: 010`` stays "010", ``--flag, yes`` stays "yes"). There are no
boolean fields. Explicit tags (``!!int``, ``!foo``, ``!!python/...``) and merge keys (``<<``)
are refused by name. Numbers must be finite; integers have at most 18 digits.

The parts, one job each: ``model.py`` (the dataclasses and their defaults), ``yaml_source.py`` (the
bounded file and YAML reading), ``scalars.py`` (plain scalars, YAML 1.2 style), ``domains.py`` (what
a host, name or user may be), ``node_reader.py`` (typed values with their positions), ``schema.py``
(the keys of each section, checked and built into the model), ``limits.py``, ``errors.py`` and
``named_files.py`` (the files an inventory names). This module is the entry point, and re-exports
the model for the code that reads inventories.
"""

from __future__ import annotations

import os
from pathlib import Path

from mscon.console.config.errors import InventoryError, oneline
from mscon.console.config.limits import MAX_DEPTH
from mscon.console.config.model import (
    DEVICE_TARGETS,
    TRANSPORTS,
    ChecksSpec,
    HangSpec,
    Inventory,
    JobSpec,
    NodeSpec,
    RestartSpec,
    SchedulerSpec,
    SlurmNodes,
    SshSpec,
    StopSpec,
)
from mscon.console.config.node_reader import NodeReader
from mscon.console.config.schema import build_inventory as _build  # by this name, so a test can break it
from mscon.console.config.yaml_source import read_yaml

__all__ = [
    "DEVICE_TARGETS",
    "TRANSPORTS",
    "ChecksSpec",
    "HangSpec",
    "Inventory",
    "InventoryError",
    "JobSpec",
    "NodeSpec",
    "RestartSpec",
    "SchedulerSpec",
    "SlurmNodes",
    "SshSpec",
    "StopSpec",
    "load_inventory",
    "load_inventory_or_default",
    "oneline",
]


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Parse and check an inventory; raises InventoryError (only) with a one-line message."""
    try:
        p = Path(path)
    except TypeError as exc:
        raise InventoryError(repr(path), 0, 0, "", f"not a path: {exc}") from None
    try:
        return _load(p)
    except InventoryError:
        raise
    except RecursionError:
        raise InventoryError(p, 0, 0, "", f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    except Exception as exc:  # last resort: nothing but InventoryError may escape
        raise InventoryError(p, 0, 0, "", f"cannot load: {type(exc).__name__}: {exc}") from None


def load_inventory_or_default(path: str | os.PathLike[str] | None) -> Inventory:
    """``path``, or without one the embedded local inventory (ranks on this machine)."""
    if path is not None:
        return load_inventory(path)
    from importlib import resources

    with resources.as_file(resources.files("mscon.inventory").joinpath("local.yaml")) as p:
        return load_inventory(p)


def _load(p: Path) -> Inventory:
    root, tagged = read_yaml(p)
    r = NodeReader(p, tagged)
    inv = _build(r, root, p)
    if tagged:  # every node is visited above, so this is only a safety net
        node = next(iter(tagged.values()))[0]
        raise r.fail(node, "", "explicit YAML tags are not supported")
    return inv
