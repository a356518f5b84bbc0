"""The inventory's schema: which keys each section takes, which are required, the domain each value
is checked against, the checks across fields (unique node names and hosts, the world size, a local
node alone, the job's script inside its workdir), and the model built from them. A key left out
keeps its dataclass's default (``model.py``, the one place defaults are written)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from mscon.console.config import named_files, ssh_includes
from mscon.console.config.domains import LABEL_RE, NAME_WHAT, PY_ABS, PY_BARE, USER_RE
from mscon.console.config.errors import gathered
from mscon.console.config.limits import (
    MAX_DEVICES_PER_NODE,
    MAX_KEY_FILE_BYTES,
    MAX_KNOWN_HOSTS_BYTES,
    MAX_NAME,
    MAX_NODES,
    MAX_USER,
    MAX_WORLD_SIZE,
)
from mscon.console.config.model import (
    DEVICE_TARGETS,
    STANDBY_KINDS,
    TRANSPORTS,
    ChecksSpec,
    HangSpec,
    Inventory,
    JobSpec,
    NodeSpec,
    RestartSpec,
    RetentionSpec,
    SchedulerSpec,
    SlurmNodes,
    SshSpec,
    StopSpec,
)
from mscon.console.config.node_reader import NodeReader
from mscon.console.config.scalars import show_value

_T = TypeVar("_T")

_TOP = {
    "name": True,
    "device_target": True,
    "defaults": False,
    "nodes": True,
    "scheduler": False,
    "job": True,
    "restart": False,
    "hang": False,
    "checks": False,
    "ssh": False,
    "stop": False,
    "retention": False,
}
_NODE_KEYS = {
    "host": True,
    "name": False,
    "devices": True,
    "transport": False,
    "user": False,
    "port": False,
    "python": False,
    "identity_file": False,
    "address": False,
    "env": False,
}
_DEFAULT_KEYS = {k: False for k in ("transport", "user", "port", "python", "identity_file", "env")}
_JOB_KEYS = {
    "workdir": False,
    "script": True,
    "args": False,
    "resume_args": False,
    "env": False,
    "exclude": False,
    "metrics": False,
    "max_workdir_gib": False,
}


def build_inventory(r: NodeReader, root: yaml.Node, path: Path) -> Inventory:
    """The inventory at ``path`` from its composed root node; relative paths resolve against its folder."""
    # Each field is read through r.gather: a bad one is recorded and skipped, so one pass reports
    # every error; the model is built only when there is none.
    top = r.mapping(root, "", _TOP)
    name = r.field(top, "name", "name", r.matching, LABEL_RE, NAME_WHAT, MAX_NAME, "a name")
    target = r.field(top, "device_target", "device_target", r.choice, DEVICE_TARGETS)

    defaults: dict[str, Any] = {}
    if "defaults" in top:
        m = r.gather(r.mapping, top["defaults"], "defaults", _DEFAULT_KEYS)
        defaults = _node_fields(r, m, "defaults") if m is not None else {}

    slurm, nodes = None, None
    if isinstance(top.get("nodes"), yaml.MappingNode):  # nodes: {from: slurm}
        slurm = r.gather(_slurm_nodes, r, top, defaults)
    else:
        nodes = r.gather(lambda: _nodes(r, top["nodes"], defaults))

    # Each optional section: the keys given, read and checked; a key left out keeps the dataclass's
    # default (the one place defaults are written).
    scheduler = _section(
        r,
        top,
        "scheduler",
        SchedulerSpec,
        {"port": lambda n, w: r.integer(n, w, 1, 65535), "host": r.address},
    )
    job = r.gather(lambda: _job(r, top["job"], path))
    restart = _section(
        r,
        top,
        "restart",
        RestartSpec,
        {
            "max_restarts": lambda n, w: r.integer(n, w, 0, 1000),
            "backoff_s": lambda n, w: r.number(n, w, 0, 600),
            "standby": lambda n, w: r.choice(n, w, STANDBY_KINDS),
            "keep_warm_s": lambda n, w: r.number(n, w, 0, 86400),
        },
    )
    hang = _section(r, top, "hang", HangSpec, {"timeout_s": lambda n, w: r.number(n, w, 5, 86400)})
    checks = _section(r, top, "checks", ChecksSpec, {"shm_min_gib": lambda n, w: r.number(n, w, 0, 1024)})
    ssh = _section(
        r,
        top,
        "ssh",
        SshSpec,
        {
            "known_hosts": lambda n, w: _file_path(r, path, n, w, MAX_KNOWN_HOSTS_BYTES),
            "config": lambda n, w: _ssh_config(r, path, n, w),
            "connect_timeout_s": lambda n, w: r.number(n, w, 0, 600, True),
            "keepalive_s": lambda n, w: r.number(n, w, 1, 300),
            "max_parallel_connects": lambda n, w: r.integer(n, w, 1, 1024),
        },
        aliases={"keepalive_interval_s": "keepalive_s"},
    )
    stop = _section(r, top, "stop", StopSpec, {"grace_s": lambda n, w: r.number(n, w, 0, 600)})
    retention = _section(
        r, top, "retention", RetentionSpec, {"keep_runs": lambda n, w: r.integer(n, w, 0, 100_000)}
    )

    if r.errors:
        raise gathered(r.errors)
    assert name is not None and target is not None and job is not None  # else an error was recorded
    return Inventory(
        path=path,
        name=name,
        device_target=target,
        nodes=nodes or (),
        job=job,
        scheduler=scheduler,
        restart=restart,
        checks=checks,
        ssh=ssh,
        stop=stop,
        hang=hang,
        slurm=slurm,
        retention=retention,
    )


def _section(
    r: NodeReader,
    top: dict[str, yaml.Node],
    key: str,
    spec: type[_T],
    read: dict[str, Callable[[yaml.Node, str], Any]],
    aliases: dict[str, str] | None = None,
) -> _T:
    """The optional top-level section ``key`` as ``spec``: its keys are ``read``'s (each reader takes
    the value's node and the field's name for messages); a key left out keeps ``spec``'s default."""
    if key not in top:
        return spec()
    m = r.gather(r.mapping, top[key], key, dict.fromkeys(read, False), aliases)
    if m is None:
        return spec()
    values = {k: r.gather(conv, m[k], f"{key}.{k}") for k, conv in read.items() if k in m}
    return spec(**{k: v for k, v in values.items() if v is not None})


def _nodes(r: NodeReader, nodes_node: yaml.Node, defaults: dict[str, Any]) -> tuple[NodeSpec, ...]:
    r.check_tag(nodes_node, "nodes")
    if not isinstance(nodes_node, yaml.SequenceNode) or not nodes_node.value:
        raise r.fail(nodes_node, "nodes", f"expected a non-empty list of nodes, got {show_value(nodes_node)}")
    if len(nodes_node.value) > MAX_NODES:
        raise r.fail(nodes_node, "nodes", f"too many nodes: {len(nodes_node.value)} (at most {MAX_NODES})")
    nodes: list[NodeSpec] = []
    seen_names: dict[str, str] = {}
    seen_hosts: set[tuple[str, int | None, str | None]] = set()
    world = 0
    for i, item in enumerate(nodes_node.value):
        where = f"nodes[{i}]"
        m = r.gather(r.mapping, item, where, _NODE_KEYS)
        if m is None:
            continue
        fields = {**defaults, **_node_fields(r, m, where)}
        host = r.field(m, "host", f"{where}.host", r.host)
        devices = r.field(
            m,
            "devices",
            f"{where}.devices",
            r.integer,
            1,
            MAX_DEVICES_PER_NODE,
            f"a positive integer (at most {MAX_DEVICES_PER_NODE})",
        )
        if devices is not None:
            world += devices
            if world > MAX_WORLD_SIZE:
                too_many = f"the world size exceeds {MAX_WORLD_SIZE} ranks"
                r.note(r.fail(m["devices"], f"{where}.devices", too_many))
        node_name = r.gather(_node_name, r, m, where, host)
        if host is None or devices is None or node_name is None:
            continue  # its errors are recorded; the checks across nodes need these three
        key = (host, fields.get("port"), fields.get("user"))
        if key in seen_hosts and fields.get("transport", NodeSpec.transport) == "ssh":
            twice = f"duplicate host {host!r} (same port and user as another node)"
            r.note(r.fail(m["host"], f"{where}.host", twice))
        # Names become folder names on every node: compare them as a case-insensitive file system would.
        folded = node_name.casefold()
        if folded in seen_names:
            same = (
                "" if seen_names[folded] == node_name else f" (same as {seen_names[folded]!r} ignoring case)"
            )
            r.note(
                r.fail(m.get("name", m["host"]), f"{where}.name", f"duplicate node name {node_name!r}{same}")
            )
        seen_names[folded] = node_name
        seen_hosts.add(key)
        env = {**defaults.get("env", {}), **fields.pop("env", {})}
        nodes.append(NodeSpec(name=node_name, host=host, devices=devices, env=env, **fields))
    if any(n.transport == "local" for n in nodes) and len(nodes_node.value) > 1:
        raise r.fail(nodes_node, "nodes", "a local node must be the only node of its inventory")
    return tuple(nodes)


def _node_name(r: NodeReader, m: dict[str, yaml.Node], where: str, host: str | None) -> str | None:
    """The node's name: its name key, else its host where that is a valid name."""
    if "name" in m:
        return r.matching(m["name"], f"{where}.name", LABEL_RE, NAME_WHAT, MAX_NAME, noun="a name")
    if host is None:
        return None
    if LABEL_RE.fullmatch(host) and len(host) <= MAX_NAME:
        return host
    raise r.fail(
        m["host"],
        f"{where}.name",
        f"missing: the host {host!r} cannot be the node's name; add name: ({NAME_WHAT})",
    )


def _slurm_nodes(r: NodeReader, top: dict[str, yaml.Node], defaults: dict[str, Any]) -> SlurmNodes:
    m = r.mapping(top["nodes"], "nodes", {"from": True, "devices": False})
    r.field(m, "from", "nodes.from", r.choice, ("slurm",))
    if isinstance(top.get("defaults"), yaml.MappingNode):
        for key, value in top["defaults"].value:
            if key.value == "transport":
                r.note(r.fail(value, "defaults.transport", "nodes from slurm are reached through srun"))
    devices = None
    if "devices" in m:
        devices = r.field(
            m,
            "devices",
            "nodes.devices",
            r.integer,
            1,
            MAX_DEVICES_PER_NODE,
            f"a positive integer (at most {MAX_DEVICES_PER_NODE})",
        )
    return SlurmNodes(devices=devices, python=defaults.get("python"), env=dict(defaults.get("env", {})))


def _node_fields(r: NodeReader, m: dict[str, yaml.Node], where: str) -> dict[str, Any]:
    """The node settings given in ``m`` (a node, or defaults); a refused one is recorded and left out."""
    read: dict[str, Callable[[yaml.Node, str], Any]] = {
        "transport": lambda n, w: r.choice(n, w, TRANSPORTS),
        "user": lambda n, w: r.matching(
            n,
            w,
            USER_RE,
            f"a login name ([A-Za-z_][A-Za-z0-9._-]*, at most {MAX_USER})",
            MAX_USER,
            noun="a login name",
        ),
        "port": lambda n, w: r.integer(n, w, 1, 65535),
        "python": lambda n, w: _python(r, n, w),
        "identity_file": lambda n, w: _identity_file(r, n, w),
        "address": r.address,
        "env": r.env_map,
    }
    out: dict[str, Any] = {}
    for key, conv in read.items():
        if key in m:
            value = r.field(m, key, f"{where}.{key}", conv)
            if value is not None:
                out[key] = value
    return out


def _identity_file(r: NodeReader, node: yaml.Node, where: str) -> str:
    return _named_file(r, node, where, os.path.expanduser(r.path_text(node, where)), MAX_KEY_FILE_BYTES)


def _python(r: NodeReader, node: yaml.Node, where: str) -> str:
    py = r.text(node, where, "an absolute path or a command name", noun="a path")
    if not (PY_ABS.fullmatch(py) or PY_BARE.fullmatch(py)):
        raise r.fail(
            node,
            where,
            "expected an absolute path or a bare command name (letters, digits, and . _ + - @ = , ~ /; "
            f"no spaces, quotes or shell characters), got {show_value(node)}",
        )
    return py


def _job(r: NodeReader, node: yaml.Node, path: Path) -> JobSpec | None:
    """The job section; None when a part it cannot do without was refused (the error is recorded)."""
    m = r.mapping(node, "job", _JOB_KEYS)
    workdir = r.gather(_workdir, r, m, node, path)
    script = r.gather(_script, r, m, workdir)
    pattern = None
    if "metrics" in m:
        mm = r.field(m, "metrics", "job.metrics", r.mapping, {"pattern": True})
        if mm is not None:
            pattern = r.field(mm, "pattern", "job.metrics.pattern", lambda n, w: _metrics_pattern(r, n, w))
    excludes = (r.field(m, "exclude", "job.exclude", r.sequence) or []) if "exclude" in m else []
    exclude = tuple(r.gather(r.path_pattern, n, f"job.exclude[{i}]") for i, n in enumerate(excludes))
    args = r.field(m, "args", "job.args", r.words) if "args" in m else ()
    env = r.field(m, "env", "job.env", r.env_map) if "env" in m else {}
    resume_args = r.field(m, "resume_args", "job.resume_args", r.words) if "resume_args" in m else ()
    limit = {}  # job.max_workdir_gib: left out, the dataclass's default
    if "max_workdir_gib" in m:
        gib = r.field(m, "max_workdir_gib", "job.max_workdir_gib", r.number, 0, 1 << 20, True)
        limit = {"max_workdir_gib": gib} if gib is not None else {}
    if workdir is None or script is None or args is None or env is None or resume_args is None:
        return None
    return JobSpec(
        workdir=workdir,
        script=script,
        args=args,
        env=env,
        exclude=tuple(e for e in exclude if e is not None),
        resume_args=resume_args,
        metrics_pattern=pattern,
        **limit,
    )


def _workdir(r: NodeReader, m: dict[str, yaml.Node], node: yaml.Node, path: Path) -> Path:
    if "workdir" in m:
        workdir = _resolve(r, path, m["workdir"], "job.workdir")
    else:
        workdir = _safe(lambda: path.parent.resolve()) or path.parent.absolute()
    if not _safe(workdir.is_dir):
        raise r.fail(m.get("workdir", node), "job.workdir", f"no such directory: {workdir}")
    return workdir


def _script(r: NodeReader, m: dict[str, yaml.Node], workdir: Path | None) -> str:
    """job.script, checked to be a file inside the workdir (where the workdir could be read)."""
    script = r.path_text(m["script"], "job.script")
    if os.path.isabs(script) or script.startswith("~"):
        raise r.fail(
            m["script"], "job.script", "must be relative to job.workdir (the workdir is synced to the nodes)"
        )
    if workdir is None:
        return script
    target = _safe(lambda: (workdir / script).resolve())
    if target is None or target == workdir or not target.is_relative_to(workdir):
        raise r.fail(
            m["script"],
            "job.script",
            f"must be a file inside job.workdir {workdir}, got {show_value(m['script'])}",
        )
    if not _safe(target.is_file):
        mode = _safe(lambda: target.stat().st_mode)
        said = "no such file" if mode is None else f"not a regular file ({named_files.kind(mode)})"
        raise r.fail(m["script"], "job.script", f"{said}: {workdir / script}")
    return script


def _metrics_pattern(r: NodeReader, node: yaml.Node, where: str) -> str:
    pattern = r.text(node, where, "a regular expression")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise r.fail(node, where, f"not a valid regular expression: {exc}") from None
    except Exception as exc:  # OverflowError, RecursionError: refused like any other bad pattern
        raise r.fail(node, where, f"not a valid regular expression: {exc}") from None
    missing = [g for g in ("step", "loss") if g not in compiled.groupindex]
    if missing:
        raise r.fail(
            node,
            where,
            "needs the named groups (?P<step>...) and (?P<loss>...) (and optionally (?P<epoch>...)); "
            f"missing: {', '.join(missing)}",
        )
    return pattern


def _safe(call: Callable[[], _T]) -> _T | None:
    """A file-system query that answers None instead of raising (too-long names, symlink loops)."""
    try:
        return call()
    except (OSError, RuntimeError, ValueError):
        return None


def _resolve(r: NodeReader, inventory_path: Path, node: yaml.Node, where: str) -> Path:
    value = r.path_text(node, where)
    p = Path(os.path.expanduser(value))
    resolved = _safe(lambda: (p if p.is_absolute() else inventory_path.parent / p).resolve())
    if resolved is None:
        raise r.fail(node, where, f"cannot resolve the path {show_value(node)}")
    return resolved


def _file_path(r: NodeReader, inventory_path: Path, node: yaml.Node, where: str, max_bytes: int) -> str:
    return _named_file(r, node, where, str(_resolve(r, inventory_path, node, where)), max_bytes)


def _ssh_config(r: NodeReader, inventory_path: Path, node: yaml.Node, where: str) -> str:
    """``ssh.config``, bounded as every named file, and so is each file its ``Include`` lines pull in."""
    config = _file_path(r, inventory_path, node, where, MAX_KEY_FILE_BYTES)
    why = ssh_includes.problem([config], MAX_KEY_FILE_BYTES)
    if why is not None:
        raise r.fail(node, where, why)
    return config


def _named_file(r: NodeReader, node: yaml.Node, where: str, path: str, max_bytes: int) -> str:
    """``path``, refused unless it is a regular file of at most ``max_bytes`` (checked before
    anything reads it; a missing one is left to its reader, as ssh does)."""
    why = named_files.problem(path, max_bytes, missing_ok=True)
    if why is not None:
        raise r.fail(node, where, why)
    return path
