"""Inventory files: YAML in, frozen dataclasses out, or one error naming file:line:col and field."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEVICE_TARGETS = ("GPU", "Ascend", "CPU")
TRANSPORTS = ("ssh", "local")


class InventoryError(Exception):
    """A problem in an inventory file; ``str()`` is the one-line message shown to the user."""

    def __init__(self, path: Path | str, line: int, col: int, fieldname: str, message: str) -> None:
        self.path, self.line, self.col, self.field, self.message = str(path), line, col, fieldname, message
        where = f"{path}:{line}:{col}" if line else str(path)
        super().__init__(f"{where}: {fieldname}: {message}" if fieldname else f"{where}: {message}")


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
    script: str  # relative to workdir
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()  # extra glob patterns kept out of the workdir sync


@dataclass(frozen=True)
class RestartSpec:
    max_restarts: int = 0


@dataclass(frozen=True)
class ChecksSpec:
    shm_min_gib: float = 1.0


@dataclass(frozen=True)
class SshSpec:
    known_hosts: str | None = None  # None: the user's ~/.ssh/known_hosts, as ssh does
    config: str | None = None  # None: the user's ~/.ssh/config, as ssh does
    connect_timeout_s: float = 10.0
    keepalive_interval_s: float = 15.0
    max_parallel_connects: int = 16


@dataclass(frozen=True)
class StopSpec:
    grace_s: float = 3.0


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

    @property
    def world_size(self) -> int:
        return sum(n.devices for n in self.nodes)


# ------------------------------------------------------------------ YAML with positions


class _Reader:
    """Walks a composed YAML node tree, so every error can point at a line and column."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, node: yaml.Node | None, fieldname: str, message: str) -> InventoryError:
        if node is None:
            return InventoryError(self.path, 0, 0, fieldname, message)
        return InventoryError(
            self.path, node.start_mark.line + 1, node.start_mark.column + 1, fieldname, message
        )

    def mapping(self, node: yaml.Node, where: str, allowed: dict[str, bool]) -> dict[str, yaml.Node]:
        """Key -> value node; ``allowed`` maps each known key to whether it is required."""
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, where or "(top level)", f"expected a mapping, got {_kind(node)}")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            name = f"{where}.{key}" if where else str(key)
            if key is None:
                raise self.fail(key_node, where, "keys must be plain names")
            if key in out:
                raise self.fail(key_node, name, "duplicate key")
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.fail(key_node, name, f"unknown key (known: {known})")
            out[key] = value_node
        for key, required in allowed.items():
            if required and key not in out:
                raise self.fail(node, f"{where}.{key}" if where else key, "missing required key")
        return out

    def scalar(self, node: yaml.Node, where: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, where, f"expected a value, got {_kind(node)}")
        return yaml.safe_load(yaml.serialize(node)) if node.tag != "tag:yaml.org,2002:str" else node.value

    def string(self, node: yaml.Node, where: str) -> str:
        value = self.scalar(node, where)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(node, where, f"expected a non-empty string, got {_show(value)}")
        return value

    def integer(self, node: yaml.Node, where: str, lo: int, hi: int | None = None, what: str = "") -> int:
        value = self.scalar(node, where)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi and value > hi):
            what = what or (f"an integer in {lo}..{hi}" if hi else f"an integer >= {lo}")
            raise self.fail(node, where, f"expected {what}, got {_show(value)}")
        return value

    def number(self, node: yaml.Node, where: str, lo: float, strict: bool = False) -> float:
        value = self.scalar(node, where)
        bad = isinstance(value, bool) or not isinstance(value, int | float)
        if bad or value < lo or (strict and value == lo):
            raise self.fail(
                node, where, f"expected a number {'>' if strict else '>='} {lo}, got {_show(value)}"
            )
        return float(value)

    def string_map(self, node: yaml.Node, where: str) -> dict[str, str]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, where, f"expected a mapping of names to values, got {_kind(node)}")
        out: dict[str, str] = {}
        for k, v in node.value:
            key = self.string(k, where)
            if key in out:
                raise self.fail(k, f"{where}.{key}", "duplicate key")
            value = self.scalar(v, f"{where}.{key}")
            if value is None or isinstance(value, list | dict):
                raise self.fail(v, f"{where}.{key}", f"expected a string or number, got {_show(value)}")
            out[key] = _env_str(value)
        return out

    def string_list(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, where, f"expected a list, got {_kind(node)}")
        out = []
        for i, item in enumerate(node.value):
            value = self.scalar(item, f"{where}[{i}]")
            if value is None or isinstance(value, list | dict):
                raise self.fail(item, f"{where}[{i}]", f"expected a string or number, got {_show(value)}")
            out.append(_env_str(value))
        return tuple(out)


def _env_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    return "a list" if isinstance(node, yaml.SequenceNode) else "a value"


def _show(value: Any) -> str:
    return "nothing" if value is None else repr(value) if isinstance(value, str) else str(value)


# ------------------------------------------------------------------ the schema


_TOP = {
    "name": True,
    "device_target": True,
    "defaults": False,
    "nodes": True,
    "scheduler": False,
    "job": True,
    "restart": False,
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


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Parse and check an inventory; raises InventoryError with a one-line message."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(p, 0, 0, "", f"cannot read: {exc.strerror or exc}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise InventoryError(p, line, col, "", f"invalid YAML: {problem}") from None
    if root is None:
        raise InventoryError(p, 0, 0, "", "the file is empty")
    return _build(_Reader(p), root, p)


def _build(r: _Reader, root: yaml.Node, path: Path) -> Inventory:
    top = r.mapping(root, "", _TOP)
    name = r.string(top["name"], "name")
    target = r.string(top["device_target"], "device_target")
    if target not in DEVICE_TARGETS:
        raise r.fail(
            top["device_target"],
            "device_target",
            f"expected one of {', '.join(DEVICE_TARGETS)}, got {target!r}",
        )

    defaults: dict[str, Any] = {}
    if "defaults" in top:
        defaults = _node_fields(r, r.mapping(top["defaults"], "defaults", _DEFAULT_KEYS), "defaults")

    nodes_node = top["nodes"]
    if not isinstance(nodes_node, yaml.SequenceNode) or not nodes_node.value:
        raise r.fail(nodes_node, "nodes", "expected a non-empty list of nodes")
    nodes: list[NodeSpec] = []
    seen_names: dict[str, yaml.Node] = {}
    seen_hosts: dict[tuple[str, int | None, str | None], yaml.Node] = {}
    for i, item in enumerate(nodes_node.value):
        where = f"nodes[{i}]"
        m = r.mapping(item, where, _NODE_KEYS)
        fields = {**defaults, **_node_fields(r, m, where)}
        host = r.string(m["host"], f"{where}.host")
        devices = r.integer(m["devices"], f"{where}.devices", 1, 4096, "a positive integer")
        node_name = r.string(m["name"], f"{where}.name") if "name" in m else host
        key = (host, fields.get("port"), fields.get("user"))
        if key in seen_hosts and fields.get("transport", "ssh") == "ssh":
            raise r.fail(
                m["host"], f"{where}.host", f"duplicate host {host!r} (same port and user as another node)"
            )
        if node_name in seen_names:
            raise r.fail(m.get("name", m["host"]), f"{where}.name", f"duplicate node name {node_name!r}")
        seen_names[node_name] = item
        seen_hosts[key] = item
        env = {**defaults.get("env", {}), **fields.pop("env", {})}
        nodes.append(NodeSpec(name=node_name, host=host, devices=devices, env=env, **fields))
    if any(n.transport == "local" for n in nodes) and len(nodes) > 1:
        raise r.fail(nodes_node, "nodes", "a local node must be the only node of its inventory")

    scheduler = SchedulerSpec()
    if "scheduler" in top:
        s = r.mapping(top["scheduler"], "scheduler", {"port": False, "host": False})
        scheduler = SchedulerSpec(
            port=r.integer(s["port"], "scheduler.port", 1, 65535) if "port" in s else 8118,
            host=r.string(s["host"], "scheduler.host") if "host" in s else None,
        )

    job = _job(r, top["job"], path)

    restart = RestartSpec()
    if "restart" in top:
        s = r.mapping(top["restart"], "restart", {"max_restarts": False})
        if "max_restarts" in s:
            restart = RestartSpec(max_restarts=r.integer(s["max_restarts"], "restart.max_restarts", 0, 1000))

    checks = ChecksSpec()
    if "checks" in top:
        s = r.mapping(top["checks"], "checks", {"shm_min_gib": False})
        if "shm_min_gib" in s:
            checks = ChecksSpec(shm_min_gib=r.number(s["shm_min_gib"], "checks.shm_min_gib", 0))

    ssh = SshSpec()
    if "ssh" in top:
        keys = {
            "known_hosts": False,
            "config": False,
            "connect_timeout_s": False,
            "keepalive_interval_s": False,
            "max_parallel_connects": False,
        }
        s = r.mapping(top["ssh"], "ssh", keys)
        kh = None
        if "known_hosts" in s:
            kh = str(_resolve(path, r.string(s["known_hosts"], "ssh.known_hosts")))
        ssh_config = str(_resolve(path, r.string(s["config"], "ssh.config"))) if "config" in s else None
        ssh = SshSpec(
            known_hosts=kh,
            config=ssh_config,
            connect_timeout_s=_opt(
                s, "connect_timeout_s", lambda n: r.number(n, "ssh.connect_timeout_s", 0, True), 10.0
            ),
            keepalive_interval_s=_opt(
                s, "keepalive_interval_s", lambda n: r.number(n, "ssh.keepalive_interval_s", 0), 15.0
            ),
            max_parallel_connects=_opt(
                s, "max_parallel_connects", lambda n: r.integer(n, "ssh.max_parallel_connects", 1, 1024), 16
            ),
        )

    stop = StopSpec()
    if "stop" in top:
        s = r.mapping(top["stop"], "stop", {"grace_s": False})
        if "grace_s" in s:
            stop = StopSpec(grace_s=r.number(s["grace_s"], "stop.grace_s", 0))

    return Inventory(
        path=path,
        name=name,
        device_target=target,
        nodes=tuple(nodes),
        job=job,
        scheduler=scheduler,
        restart=restart,
        checks=checks,
        ssh=ssh,
        stop=stop,
    )


def _opt(m: dict[str, yaml.Node], key: str, conv: Callable[[yaml.Node], Any], default: Any) -> Any:
    return conv(m[key]) if key in m else default


def _node_fields(r: _Reader, m: dict[str, yaml.Node], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "transport" in m:
        t = r.string(m["transport"], f"{where}.transport")
        if t not in TRANSPORTS:
            raise r.fail(
                m["transport"], f"{where}.transport", f"expected one of {', '.join(TRANSPORTS)}, got {t!r}"
            )
        out["transport"] = t
    if "user" in m:
        out["user"] = r.string(m["user"], f"{where}.user")
    if "port" in m:
        out["port"] = r.integer(m["port"], f"{where}.port", 1, 65535)
    if "python" in m:
        out["python"] = r.string(m["python"], f"{where}.python")
    if "identity_file" in m:
        out["identity_file"] = os.path.expanduser(r.string(m["identity_file"], f"{where}.identity_file"))
    if "address" in m:
        out["address"] = r.string(m["address"], f"{where}.address")
    if "env" in m:
        out["env"] = r.string_map(m["env"], f"{where}.env")
    return out


def _job(r: _Reader, node: yaml.Node, path: Path) -> JobSpec:
    keys = {"workdir": False, "script": True, "args": False, "env": False, "exclude": False}
    m = r.mapping(node, "job", keys)
    workdir = (
        _resolve(path, r.string(m["workdir"], "job.workdir")) if "workdir" in m else path.parent.resolve()
    )
    if not workdir.is_dir():
        raise r.fail(m.get("workdir", node), "job.workdir", f"no such directory: {workdir}")
    script = r.string(m["script"], "job.script")
    if os.path.isabs(script):
        raise r.fail(
            m["script"], "job.script", "must be relative to job.workdir (the workdir is synced to the nodes)"
        )
    if not (workdir / script).is_file():
        raise r.fail(m["script"], "job.script", f"no such file: {workdir / script}")
    return JobSpec(
        workdir=workdir,
        script=script,
        args=r.string_list(m["args"], "job.args") if "args" in m else (),
        env=r.string_map(m["env"], "job.env") if "env" in m else {},
        exclude=r.string_list(m["exclude"], "job.exclude") if "exclude" in m else (),
    )


def _resolve(inventory_path: Path, value: str) -> Path:
    p = Path(os.path.expanduser(value))
    return (p if p.is_absolute() else inventory_path.parent / p).resolve()
