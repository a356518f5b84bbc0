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
from mscon.console.config.domains import LABEL_RE, NAME_WHAT, PY_ABS, PY_BARE, USER_RE
from mscon.console.config.limits import MAX_DEVICES_PER_NODE, MAX_NAME, MAX_NODES, MAX_USER, MAX_WORLD_SIZE
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
}


def build_inventory(r: NodeReader, root: yaml.Node, path: Path) -> Inventory:
    """The inventory at ``path`` from its composed root node; relative paths resolve against its folder."""
    top = r.mapping(root, "", _TOP)
    name = r.matching(top["name"], "name", LABEL_RE, NAME_WHAT, MAX_NAME, noun="a name")
    target = r.choice(top["device_target"], "device_target", DEVICE_TARGETS)

    defaults: dict[str, Any] = {}
    if "defaults" in top:
        defaults = _node_fields(r, r.mapping(top["defaults"], "defaults", _DEFAULT_KEYS), "defaults")

    slurm = None
    if isinstance(top["nodes"], yaml.MappingNode):  # nodes: {from: slurm}
        slurm, nodes = _slurm_nodes(r, top, defaults), ()
    else:
        nodes = _nodes(r, top["nodes"], defaults)

    # Each optional section: the keys given, read and checked; a key left out keeps the dataclass's
    # default (the one place defaults are written).
    scheduler = _section(
        r,
        top,
        "scheduler",
        SchedulerSpec,
        {"port": lambda n, w: r.integer(n, w, 1, 65535), "host": r.address},
    )
    job = _job(r, top["job"], path)
    restart = _section(
        r,
        top,
        "restart",
        RestartSpec,
        {
            "max_restarts": lambda n, w: r.integer(n, w, 0, 1000),
            "backoff_s": lambda n, w: r.number(n, w, 0, 600),
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
            "known_hosts": lambda n, w: _file_path(r, path, n, w),
            "config": lambda n, w: _file_path(r, path, n, w),
            "connect_timeout_s": lambda n, w: r.number(n, w, 0, 600, True),
            "keepalive_s": lambda n, w: r.number(n, w, 1, 300),
            "max_parallel_connects": lambda n, w: r.integer(n, w, 1, 1024),
        },
        aliases={"keepalive_interval_s": "keepalive_s"},
    )
    stop = _section(r, top, "stop", StopSpec, {"grace_s": lambda n, w: r.number(n, w, 0, 600)})

    return Inventory(
        path=path,
        name=name,
        device_target=target,
        nodes=nodes,
        job=job,
        scheduler=scheduler,
        restart=restart,
        checks=checks,
        ssh=ssh,
        stop=stop,
        hang=hang,
        slurm=slurm,
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
    m = r.mapping(top[key], key, dict.fromkeys(read, False), aliases)
    return spec(**{k: conv(m[k], f"{key}.{k}") for k, conv in read.items() if k in m})


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
        m = r.mapping(item, where, _NODE_KEYS)
        fields = {**defaults, **_node_fields(r, m, where)}
        host = r.host(m["host"], f"{where}.host")
        devices = r.integer(
            m["devices"],
            f"{where}.devices",
            1,
            MAX_DEVICES_PER_NODE,
            f"a positive integer (at most {MAX_DEVICES_PER_NODE})",
        )
        world += devices
        if world > MAX_WORLD_SIZE:
            raise r.fail(m["devices"], f"{where}.devices", f"the world size exceeds {MAX_WORLD_SIZE} ranks")
        if "name" in m:
            node_name = r.matching(m["name"], f"{where}.name", LABEL_RE, NAME_WHAT, MAX_NAME, noun="a name")
        elif LABEL_RE.fullmatch(host) and len(host) <= MAX_NAME:
            node_name = host
        else:
            raise r.fail(
                m["host"],
                f"{where}.name",
                f"missing: the host {host!r} cannot be the node's name; add name: ({NAME_WHAT})",
            )
        key = (host, fields.get("port"), fields.get("user"))
        if key in seen_hosts and fields.get("transport", NodeSpec.transport) == "ssh":
            raise r.fail(
                m["host"], f"{where}.host", f"duplicate host {host!r} (same port and user as another node)"
            )
        # Names become folder names on every node: compare them as a case-insensitive file system would.
        folded = node_name.casefold()
        if folded in seen_names:
            same = (
                "" if seen_names[folded] == node_name else f" (same as {seen_names[folded]!r} ignoring case)"
            )
            raise r.fail(
                m.get("name", m["host"]), f"{where}.name", f"duplicate node name {node_name!r}{same}"
            )
        seen_names[folded] = node_name
        seen_hosts.add(key)
        env = {**defaults.get("env", {}), **fields.pop("env", {})}
        nodes.append(NodeSpec(name=node_name, host=host, devices=devices, env=env, **fields))
    if any(n.transport == "local" for n in nodes) and len(nodes) > 1:
        raise r.fail(nodes_node, "nodes", "a local node must be the only node of its inventory")
    return tuple(nodes)


def _slurm_nodes(r: NodeReader, top: dict[str, yaml.Node], defaults: dict[str, Any]) -> SlurmNodes:
    m = r.mapping(top["nodes"], "nodes", {"from": True, "devices": False})
    r.choice(m["from"], "nodes.from", ("slurm",))
    if "defaults" in top:
        for key, value in top["defaults"].value:
            if key.value == "transport":
                raise r.fail(value, "defaults.transport", "nodes from slurm are reached through srun")
    devices = None
    if "devices" in m:
        devices = r.integer(
            m["devices"],
            "nodes.devices",
            1,
            MAX_DEVICES_PER_NODE,
            f"a positive integer (at most {MAX_DEVICES_PER_NODE})",
        )
    return SlurmNodes(devices=devices, python=defaults.get("python"), env=dict(defaults.get("env", {})))


def _node_fields(r: NodeReader, m: dict[str, yaml.Node], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "transport" in m:
        out["transport"] = r.choice(m["transport"], f"{where}.transport", TRANSPORTS)
    if "user" in m:
        out["user"] = r.matching(
            m["user"],
            f"{where}.user",
            USER_RE,
            f"a login name ([A-Za-z_][A-Za-z0-9._-]*, at most {MAX_USER})",
            MAX_USER,
            noun="a login name",
        )
    if "port" in m:
        out["port"] = r.integer(m["port"], f"{where}.port", 1, 65535)
    if "python" in m:
        py = r.text(m["python"], f"{where}.python", "an absolute path or a command name", noun="a path")
        if not (PY_ABS.fullmatch(py) or PY_BARE.fullmatch(py)):
            raise r.fail(
                m["python"],
                f"{where}.python",
                "expected an absolute path or a bare command name (letters, digits, and . _ + - @ = , ~ /; "
                f"no spaces, quotes or shell characters), got {show_value(m['python'])}",
            )
        out["python"] = py
    if "identity_file" in m:
        out["identity_file"] = os.path.expanduser(r.path_text(m["identity_file"], f"{where}.identity_file"))
    if "address" in m:
        out["address"] = r.address(m["address"], f"{where}.address")
    if "env" in m:
        out["env"] = r.env_map(m["env"], f"{where}.env")
    return out


def _job(r: NodeReader, node: yaml.Node, path: Path) -> JobSpec:
    m = r.mapping(node, "job", _JOB_KEYS)
    if "workdir" in m:
        workdir = _resolve(r, path, m["workdir"], "job.workdir")
    else:
        workdir = _safe(lambda: path.parent.resolve()) or path.parent.absolute()
    if not _safe(workdir.is_dir):
        raise r.fail(m.get("workdir", node), "job.workdir", f"no such directory: {workdir}")
    script = r.path_text(m["script"], "job.script")
    if os.path.isabs(script) or script.startswith("~"):
        raise r.fail(
            m["script"], "job.script", "must be relative to job.workdir (the workdir is synced to the nodes)"
        )
    target = _safe(lambda: (workdir / script).resolve())
    if target is None or target == workdir or not target.is_relative_to(workdir):
        raise r.fail(
            m["script"],
            "job.script",
            f"must be a file inside job.workdir {workdir}, got {show_value(m['script'])}",
        )
    if not _safe(target.is_file):
        raise r.fail(m["script"], "job.script", f"no such file: {workdir / script}")
    pattern = None
    if "metrics" in m:
        mm = r.mapping(m["metrics"], "job.metrics", {"pattern": True})
        pattern = _metrics_pattern(r, mm["pattern"], "job.metrics.pattern")
    excludes = r.sequence(m["exclude"], "job.exclude") if "exclude" in m else []
    return JobSpec(
        workdir=workdir,
        script=script,
        args=r.words(m["args"], "job.args") if "args" in m else (),
        env=r.env_map(m["env"], "job.env") if "env" in m else {},
        exclude=tuple(
            r.text(n, f"job.exclude[{i}]", "a glob pattern", noun="a glob pattern")
            for i, n in enumerate(excludes)
        ),
        resume_args=r.words(m["resume_args"], "job.resume_args") if "resume_args" in m else (),
        metrics_pattern=pattern,
    )


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


def _file_path(r: NodeReader, inventory_path: Path, node: yaml.Node, where: str) -> str:
    return str(_resolve(r, inventory_path, node, where))
