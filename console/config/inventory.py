"""Inventory files: YAML in, frozen dataclasses out, or one error naming file:line:col and field.

``load_inventory`` raises nothing but ``InventoryError``, whose ``str()`` is always one line:
``FILE:LINE:COL: FIELD: MESSAGE`` (``FILE: FIELD: MESSAGE`` where no position applies).

Schema (``*`` = required; a key left out takes its field's default in the dataclasses below,
written there only; brackets say what a missing key means where that is not a plain value):

    name*            a label: [A-Za-z0-9_][A-Za-z0-9._-]*, at most 64 characters
    device_target*   GPU | Ascend | CPU
    defaults         transport, user, port, python, identity_file, env: applied to every node
    nodes*           1..1024 mappings, or {from: slurm, devices [from the allocation]: 1..1024}:
                     the nodes of the Slurm allocation, found at run time (console/config/slurm.py);
                     defaults' python and env apply to each, its transport is srun
      host*          hostname, IPv4/IPv6 literal or ssh-config alias ([A-Za-z0-9._-], not
                     starting with '-' or '.'), at most 255 characters
      devices*       1..1024; the world size (their sum) is at most 65536
      name [host]    a label as above, at most 64 characters, unique ignoring case
      transport      ssh | local; a local node must be the only node
      user           a login name: [A-Za-z_][A-Za-z0-9._-]*[$]?, at most 32 characters
      port           1..65535
      python         an absolute path or a bare command name, without spaces or shell characters
      identity_file  a path (no control characters, not starting with '-')
      address        how other nodes reach this one: an IP literal or an RFC 1123 hostname
      env            NAME: value, NAME = [A-Za-z_][A-Za-z0-9_]*, values without NUL/control chars
    scheduler        port 1..65535; host [the first node's address]: like address
    job*             workdir [the inventory's folder]: an existing directory, synced to the nodes
                     script*: a file inside workdir, given relative to it (symlinks resolved)
                     args, resume_args (appended from the second attempt on), exclude: lists
                     env: as a node's env; metrics: {pattern: a regex with named groups
                     step and loss, optionally epoch}
    restart          max_restarts 0..1000, backoff_s 0..600
    hang             timeout_s 5..86400: seconds without output before a rank counts as hung
    checks           shm_min_gib 0..1024
    ssh              known_hosts, config (paths, relative to the inventory's folder);
                     connect_timeout_s (0, 600]; keepalive_s 1..300 (old name:
                     keepalive_interval_s); max_parallel_connects 1..1024
    stop             grace_s 0..600

YAML: the file must be a regular file of at most 1 MiB, UTF-8 without NUL bytes, one document
nested at most 32 deep, with at most 100,000 values after expanding aliases (billion laughs).
Plain scalars follow YAML 1.2's core schema; those YAML 1.1 would read differently are refused
where a number is expected (010, 0x1f, 1:20, 1_000), and read as the text written where a
string is expected (so ``GLOG_v: 010`` stays "010", ``--flag, yes`` stays "yes"). There are no
boolean fields. Explicit tags (``!!int``, ``!foo``, ``!!python/...``) and merge keys (``<<``)
are refused by name. Numbers must be finite; integers have at most 18 digits.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import stat
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml
from mscon.agent.policy import DEFAULT_GRACE_S

_T = TypeVar("_T")

DEVICE_TARGETS = ("GPU", "Ascend", "CPU")
TRANSPORTS = ("ssh", "local")

# Limits, checked before the work they bound grows.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_YAML_VALUES = 100_000  # after alias expansion
MAX_NODES = 1024
MAX_DEVICES_PER_NODE = 1024
MAX_WORLD_SIZE = 65536
MAX_INT_DIGITS = 18
MAX_NUMBER_CHARS = 32
MAX_TEXT = 4096  # paths, patterns, anything without a tighter bound
MAX_VALUE = 32768  # env values and argv words
MAX_ITEMS = 1024  # entries of one list or env mapping
MAX_HOST = 255
MAX_NAME = 64
MAX_USER = 32
MAX_ENV_KEY = 256


class InventoryError(Exception):
    """A problem in an inventory file; ``str()`` is the one-line message shown to the user."""

    def __init__(self, path: Path | str, line: int, col: int, fieldname: str, message: str) -> None:
        path, fieldname, message = oneline(str(path)), oneline(fieldname), oneline(message)
        self.path, self.line, self.col, self.field, self.message = path, line, col, fieldname, message
        where = f"{path}:{line}:{col}" if line else path
        super().__init__(f"{where}: {fieldname}: {message}" if fieldname else f"{where}: {message}")


def oneline(text: str) -> str:
    """``text`` with every non-printable character escaped, so it can never span lines."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


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


@dataclass(frozen=True)
class RestartSpec:
    max_restarts: int = 0
    backoff_s: float = 2.0


@dataclass(frozen=True)
class HangSpec:
    timeout_s: float = 120.0  # a rank silent this long counts as hung


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

    @property
    def world_size(self) -> int:
        return sum(n.devices for n in self.nodes)


# ------------------------------------------------------------------ reading the file


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
    text = _decode(p, _read_bytes(p))
    root, tagged = _compose(p, text)
    _check_expanded(p, root)
    r = _Reader(p, tagged)
    inv = _build(r, root, p)
    if tagged:  # every node is visited above, so this is only a safety net
        node = next(iter(tagged.values()))[0]
        raise r.fail(node, "", "explicit YAML tags are not supported")
    return inv


def _read_bytes(p: Path) -> bytes:
    try:
        st = os.stat(p)
    except (OSError, ValueError) as exc:
        raise InventoryError(p, 0, 0, "", f"cannot read: {_os_reason(exc)}") from None
    _check_regular(p, st.st_mode)
    if st.st_size > MAX_FILE_BYTES:
        raise InventoryError(p, 0, 0, "", f"file too large: {st.st_size} bytes (at most {MAX_FILE_BYTES})")
    try:
        # Non-blocking: if the path became a FIFO since the stat, the open must not wait for a writer.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InventoryError(p, 0, 0, "", f"cannot read: {_os_reason(exc)}") from None
    try:
        _check_regular(p, os.fstat(fd).st_mode)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InventoryError(p, 0, 0, "", f"cannot read: {_os_reason(exc)}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise InventoryError(p, 0, 0, "", f"file too large: more than {MAX_FILE_BYTES} bytes")
    return data


def _os_reason(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _check_regular(p: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    kind = next((name for test, name in kinds if test(mode)), "not a file")
    raise InventoryError(p, 0, 0, "", f"cannot read: not a regular file ({kind})")


_BOMS = [
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
]


def _decode(p: Path, data: bytes) -> str:
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise InventoryError(p, 1, 1, "", f"the file is {name} (byte-order mark): save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        line, col = _position(data, nul)
        raise InventoryError(
            p, line, col, "", "contains a NUL byte (not a text file, or UTF-16/32: save it as UTF-8)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _position(data, exc.start)
        msg = f"not valid UTF-8 (byte 0x{data[exc.start]:02x}): save the file as UTF-8"
        raise InventoryError(p, line, col, "", msg) from None


def _position(data: bytes | str, offset: int) -> tuple[int, int]:
    nl: Any = b"\n" if isinstance(data, bytes) else "\n"
    return data.count(nl, 0, offset) + 1, offset - (data.rfind(nl, 0, offset) + 1) + 1


# ------------------------------------------------------------------ YAML, bounded


class _Limit(Exception):
    def __init__(self, mark: Any, message: str) -> None:
        super().__init__(message)
        self.mark, self.message = mark, message


class _Composer(yaml.SafeLoader):
    """PyYAML's safe loader used only to compose: it records explicit tags and stops at the limits
    while composing, before its recursion or the node count can grow."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0
        self.count = 0
        self.tagged: dict[int, tuple[yaml.Node, str]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            return super().compose_node(parent, index)
        self.count += 1
        if self.count > MAX_YAML_VALUES:
            raise _Limit(event.start_mark, f"more than {MAX_YAML_VALUES} YAML values")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Limit(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        tag = getattr(event, "tag", None)
        if tag is not None:
            self.tagged[id(node)] = (node, tag)
        return node


def _compose(p: Path, text: str) -> tuple[yaml.Node, dict[int, tuple[yaml.Node, str]]]:
    try:
        loader = _Composer(text)  # its reader already refuses unprintable characters here
    except yaml.YAMLError as exc:
        raise _yaml_error(p, text, exc) from None
    try:
        root = loader.get_single_node()
    except _Limit as exc:
        raise InventoryError(p, exc.mark.line + 1, exc.mark.column + 1, "", exc.message) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(p, text, exc) from None
    except RecursionError:
        raise InventoryError(p, 0, 0, "", f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    if root is None:
        raise InventoryError(p, 0, 0, "", "the file is empty")
    return root, loader.tagged


def _yaml_error(p: Path, text: str, exc: yaml.YAMLError) -> InventoryError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        if exc.problem and exc.context:
            problem = f"{exc.problem} ({exc.context})"
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        return InventoryError(p, line, col, "", f"invalid YAML: {problem}")
    if isinstance(exc, yaml.reader.ReaderError):
        line, col = _position(text, exc.position)
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        msg = (
            f"invalid YAML: unacceptable character U+{ord(char):04X} (write it as an escape in double quotes)"
        )
        return InventoryError(p, line, col, "", msg)
    return InventoryError(p, 0, 0, "", f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else exc!r}")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expanded(p: Path, root: yaml.Node) -> None:
    """Refuse alias cycles, and trees that aliases make too deep or too big (billion laughs).

    An iterative depth-first walk over the composed graph, with each node's expanded size
    memoized, so the cost is that of the file, not of the expansion."""

    def fail(node: yaml.Node, message: str) -> NoReturn:
        m = node.start_mark
        raise InventoryError(p, m.line + 1, m.column + 1, "", message)

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = {id(root)}
    stack: list[tuple[yaml.Node, Iterator[yaml.Node]]] = [(root, iter(_children(root)))]
    while stack:
        node, it = stack[-1]
        child = next(it, None)
        if child is None:
            stack.pop()
            open_.discard(id(node))
            kids = _children(node)
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[id(node)] > MAX_YAML_VALUES:
                fail(node, f"more than {MAX_YAML_VALUES} YAML values once aliases are expanded")
            continue
        if id(child) in open_:
            fail(child, "an alias refers to a collection that contains it (a recursive alias)")
        if id(child) in size:
            if len(stack) + depth[id(child)] > MAX_DEPTH:
                fail(child, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
            continue
        if len(stack) >= MAX_DEPTH:
            fail(child, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
        open_.add(id(child))
        stack.append((child, iter(_children(child))))


# ------------------------------------------------------------------ scalars, YAML 1.2 style

_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_DEC_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_SPECIAL = re.compile(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")
_LEADING_ZERO = re.compile(r"[-+]?0[0-9]+")
_BASE_PREFIX = re.compile(r"[-+]?0[xXoObB][0-9a-fA-F_]*")
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_UNDERSCORED = re.compile(r"[-+]?[0-9_]*[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?")


@dataclass(frozen=True)
class _Num:
    """A plain scalar read where a number is expected: its value, or why it has none."""

    value: int | float | None = None
    problem: str = ""  # a complete message, when the text looks like a number but is refused
    nonfinite: bool = False  # .nan, .inf, 1e999: the message names the expected range


def _plain_number(text: str) -> _Num:
    sign_free = text.lstrip("+-")
    if _DEC_INT.fullmatch(text):
        if len(sign_free) > MAX_INT_DIGITS:
            return _Num(problem=f"too many digits: {len(sign_free)} (at most {MAX_INT_DIGITS})")
        return _Num(int(text))
    if _LEADING_ZERO.fullmatch(text):
        octal = f", YAML 1.1 as octal {int(text, 8)}" if set(sign_free) <= set("01234567") else ""
        return _Num(
            problem=f"ambiguous number {text!r} (YAML 1.2 reads it as {int(text)}{octal}): "
            "write a decimal without leading zeros, or quote it where a string is meant"
        )
    if _BASE_PREFIX.fullmatch(text):
        return _Num(problem=f"ambiguous number {text!r}: write it as a plain decimal")
    if _SEXAGESIMAL.fullmatch(text):
        base60 = ""
        if "." not in text and "_" not in text:
            total = 0
            for part in sign_free.split(":"):
                total = total * 60 + int(part)
            base60 = f" {-total if text.startswith('-') else total}"
        return _Num(
            problem=f"ambiguous value {text!r} (YAML 1.1 reads it as the base-60 number{base60}): "
            "write a plain decimal number, or quote it where a string is meant"
        )
    if "_" in text and _UNDERSCORED.fullmatch(text):
        return _Num(problem=f"ambiguous number {text!r} (YAML 1.1 ignores '_'): write it without underscores")
    if _FLOAT.fullmatch(text):
        if len(text) > MAX_NUMBER_CHARS:
            return _Num(problem=f"number too long: {len(text)} characters (at most {MAX_NUMBER_CHARS})")
        value = float(text)
        return _Num(value) if math.isfinite(value) else _Num(nonfinite=True)
    if _SPECIAL.fullmatch(text):
        return _Num(nonfinite=True)
    return _Num()


def _is_plain(node: yaml.ScalarNode) -> bool:
    return node.style is None or node.style == ""


def _show(node: yaml.Node) -> str:
    """How a value is quoted back in a message: numbers as written, strings quoted and cut short."""
    if not isinstance(node, yaml.ScalarNode):
        return _kind(node)
    text = node.value
    if _is_plain(node):
        if text in _NULLS:
            return "nothing"
        if text in _BOOLS or _DEC_INT.fullmatch(text) or _SPECIAL.fullmatch(text):
            return text[:40] + ("..." if len(text) > 40 else "")
        if _FLOAT.fullmatch(text) and len(text) <= MAX_NUMBER_CHARS:
            return text
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    return "a list" if isinstance(node, yaml.SequenceNode) else "a value"


_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BAD_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def _bad_char(value: str, allowed: str = "") -> str | None:
    """The first control or invisible character in ``value`` that is not in ``allowed``."""
    for m in _ASCII_CONTROL.finditer(value):
        if m.group() not in allowed:
            return m.group()
    if not value.isascii():
        for c in value:
            if ord(c) >= 0x7F and unicodedata.category(c) in _BAD_CATEGORIES:
                return c
    return None


def _describe(c: str) -> str:
    if c == "\0":
        return "a NUL character"
    if c in "\n\r\x85\u2028\u2029":
        return f"a line break (U+{ord(c):04X})"
    if unicodedata.category(c) == "Cc":
        return f"a control character (U+{ord(c):04X})"
    return f"an invisible or unpaired character (U+{ord(c):04X})"


def _label(key: str) -> str:
    """A mapping key as a part of a field name."""
    if re.fullmatch(r"[A-Za-z0-9_.<-]{1,64}", key):
        return key
    return repr(key[:40] + ("..." if len(key) > 40 else ""))


# ------------------------------------------------------------------ value domains

_LABEL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*", re.ASCII)
_ALIAS_RE = _LABEL_RE  # ssh-config aliases, hostnames and IPv4 literals all fit it
_DOTTED_NUMBERS = re.compile(r"[0-9.]+", re.ASCII)
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)
_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*\$?", re.ASCII)
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_PY_ABS = re.compile(r"/[A-Za-z0-9._+@=,~/-]*", re.ASCII)
_PY_BARE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*", re.ASCII)

_HOST_WHAT = (
    "a hostname, IP address or ssh-config alias "
    "(letters, digits, '.', '_', '-'; not starting with '-' or '.')"
)
_ADDRESS_WHAT = "an IP address or hostname"


def _ip_literal(value: str) -> bool:
    if "%" in value:  # scoped IPv6 addresses name an interface of one machine only
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _host_problem(value: str) -> str | None:
    """None: not in the domain at all; "": fine; else what is wrong with it."""
    if ":" in value:
        return "" if _ip_literal(value) else "not a valid IPv6 address (no brackets, no %zone)"
    if not _ALIAS_RE.fullmatch(value):
        return None
    if _DOTTED_NUMBERS.fullmatch(value) and not _ip_literal(value):
        return "not a valid IPv4 address"
    return ""


def _hostname(value: str) -> bool:
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    return len(value) <= 253 and all(_HOST_LABEL.fullmatch(lab) for lab in labels)


# ------------------------------------------------------------------ the node tree, with positions


class _Reader:
    """Walks a composed YAML node tree, so every error can point at a line and column."""

    def __init__(self, path: Path, tagged: dict[int, tuple[yaml.Node, str]] | None = None) -> None:
        self.path = path
        self.tagged = tagged if tagged is not None else {}

    def fail(self, node: yaml.Node | None, fieldname: str, message: str) -> InventoryError:
        if node is None:
            return InventoryError(self.path, 0, 0, fieldname, message)
        return InventoryError(
            self.path, node.start_mark.line + 1, node.start_mark.column + 1, fieldname, message
        )

    def check_tag(self, node: yaml.Node, where: str) -> None:
        if id(node) in self.tagged:
            tag = self.tagged[id(node)][1]
            raise self.fail(node, where, f"explicit YAML tags are not supported (found {tag[:60]})")

    def mapping(
        self, node: yaml.Node, where: str, allowed: dict[str, bool], aliases: dict[str, str] | None = None
    ) -> dict[str, yaml.Node]:
        """Key -> value node; ``allowed`` maps each known key to whether it is required;
        ``aliases`` maps old key names to current ones."""
        self.check_tag(node, where or "(top level)")
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, where or "(top level)", f"expected a mapping, got {_kind(node)}")
        aliases = aliases or {}
        out: dict[str, yaml.Node] = {}
        spelled: dict[str, str] = {}
        for key_node, value_node in node.value:
            key = self.key(key_node, where)
            name = f"{where}.{_label(key)}" if where else _label(key)
            canon = aliases.get(key, key)
            if canon in out:
                other = spelled[canon]
                raise self.fail(
                    key_node,
                    name,
                    "duplicate key" if other == key else f"duplicate key (also given as {other})",
                )
            if canon not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.fail(key_node, name, f"unknown key (known: {known})")
            out[canon] = value_node
            spelled[canon] = key
        for key, required in allowed.items():
            if required and key not in out:
                raise self.fail(node, f"{where}.{key}" if where else key, "missing required key")
        return out

    def key(self, node: yaml.Node, where: str) -> str:
        if not isinstance(node, yaml.ScalarNode):
            self.check_tag(node, where or "(top level)")
            raise self.fail(node, where or "(top level)", "keys must be plain names")
        name = f"{where}.{_label(node.value)}" if where else _label(node.value)
        self.check_tag(node, name)
        if node.value == "<<" and _is_plain(node):
            raise self.fail(
                node,
                name,
                "YAML merge keys (<<) are not supported: write the keys out "
                "(settings shared by all nodes go in defaults)",
            )
        return node.value

    def sequence(self, node: yaml.Node, where: str, what: str = "a list") -> list[yaml.Node]:
        self.check_tag(node, where)
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, where, f"expected {what}, got {_show(node)}")
        if len(node.value) > MAX_ITEMS:
            raise self.fail(node, where, f"too many items: {len(node.value)} (at most {MAX_ITEMS})")
        return node.value

    def _scalar(self, node: yaml.Node, where: str, what: str) -> yaml.ScalarNode:
        self.check_tag(node, where)
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, where, f"expected {what}, got {_kind(node)}")
        return node

    def text(
        self,
        node: yaml.Node,
        where: str,
        what: str = "a non-empty string",
        maxlen: int = MAX_TEXT,
        *,
        allow_empty: bool = False,
        allowed_controls: str = "",
    ) -> str:
        """A string field: the scalar's text as written (a plain 010 stays "010"), never null."""
        s = self._scalar(node, where, what)
        if _is_plain(s) and s.value in _NULLS:
            raise self.fail(node, where, f"expected {what}, got nothing")
        value = s.value
        if not allow_empty and not value.strip():
            raise self.fail(node, where, f"expected {what}, got {value!r}")
        if len(value) > maxlen:
            raise self.fail(node, where, f"too long: {len(value)} characters (at most {maxlen})")
        bad = _bad_char(value, allowed_controls)
        if bad is not None:
            raise self.fail(node, where, f"contains {_describe(bad)}")
        return value

    def matching(self, node: yaml.Node, where: str, pattern: re.Pattern[str], what: str, maxlen: int) -> str:
        value = self.text(node, where, what, maxlen)
        if not pattern.fullmatch(value):
            raise self.fail(node, where, f"expected {what}, got {_show(node)}")
        return value

    def choice(self, node: yaml.Node, where: str, choices: tuple[str, ...]) -> str:
        what = f"one of {', '.join(choices)}"
        value = self.text(node, where, what, 64)
        if value not in choices:
            raise self.fail(node, where, f"expected {what}, got {_show(node)}")
        return value

    def _number(self, node: yaml.Node, where: str, what: str) -> int | float:
        s = self._scalar(node, where, what)
        if not _is_plain(s):
            raise self.fail(node, where, f"expected {what}, got {_show(node)} (a quoted string)")
        num = _plain_number(s.value)
        if num.problem:
            raise self.fail(node, where, num.problem)
        if num.nonfinite:
            raise self.fail(node, where, f"expected {what} (a finite number), got {_show(node)}")
        if num.value is None:
            raise self.fail(node, where, f"expected {what}, got {_show(node)}")
        return num.value

    def integer(self, node: yaml.Node, where: str, lo: int, hi: int, what: str = "") -> int:
        what = what or f"an integer in {lo}..{hi}"
        value = self._number(node, where, what)
        if not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(node, where, f"expected {what}, got {_show(node)}")
        return value

    def number(self, node: yaml.Node, where: str, lo: float, hi: float, lo_open: bool = False) -> float:
        what = f"a number > {lo:g} and <= {hi:g}" if lo_open else f"a number in {lo:g}..{hi:g}"
        value = self._number(node, where, what)
        if value < lo or value > hi or (lo_open and value == lo):
            raise self.fail(node, where, f"expected {what}, got {_show(node)}")
        return float(value)

    def env_map(self, node: yaml.Node, where: str) -> dict[str, str]:
        self.check_tag(node, where)
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, where, f"expected a mapping of names to values, got {_show(node)}")
        if len(node.value) > MAX_ITEMS:
            raise self.fail(node, where, f"too many entries: {len(node.value)} (at most {MAX_ITEMS})")
        out: dict[str, str] = {}
        for k, v in node.value:
            key = self.key(k, where)
            name = f"{where}.{_label(key)}"
            if not _ENV_KEY_RE.fullmatch(key) or len(key) > MAX_ENV_KEY:
                raise self.fail(
                    k,
                    name,
                    f"expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*), got {key[:60]!r}",
                )
            if key in out:
                raise self.fail(k, name, "duplicate key")
            out[key] = self.word(v, name)
        return out

    def word(self, node: yaml.Node, where: str) -> str:
        """An env value or argv word: any text (empty too, tabs and newlines allowed), or a number."""
        return self.text(
            node, where, "a string or number", MAX_VALUE, allow_empty=True, allowed_controls="\t\n"
        )

    def words(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        return tuple(self.word(item, f"{where}[{i}]") for i, item in enumerate(self.sequence(node, where)))

    def path_text(self, node: yaml.Node, where: str) -> str:
        value = self.text(node, where, "a path")
        if value.startswith("-"):
            raise self.fail(node, where, f"a path must not start with '-', got {_show(node)}")
        return value

    def host(self, node: yaml.Node, where: str) -> str:
        value = self.text(node, where, _HOST_WHAT, MAX_HOST)
        problem = _host_problem(value)
        if problem is None:
            raise self.fail(node, where, f"expected {_HOST_WHAT}, got {_show(node)}")
        if problem:
            raise self.fail(node, where, f"{problem}: {_show(node)}")
        return value

    def address(self, node: yaml.Node, where: str) -> str:
        value = self.text(node, where, _ADDRESS_WHAT, MAX_HOST)
        if not (_ip_literal(value) or (_hostname(value) and not _DOTTED_NUMBERS.fullmatch(value))):
            raise self.fail(
                node,
                where,
                f"expected {_ADDRESS_WHAT} (RFC 1123: letters, digits, '-', '.'), got {_show(node)}",
            )
        return value


# ------------------------------------------------------------------ the schema


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
_NAME_WHAT = f"a name of letters, digits, '.', '_', '-' (not starting with '-' or '.', at most {MAX_NAME})"


def _build(r: _Reader, root: yaml.Node, path: Path) -> Inventory:
    top = r.mapping(root, "", _TOP)
    name = r.matching(top["name"], "name", _LABEL_RE, _NAME_WHAT, MAX_NAME)
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
    r: _Reader,
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


def _nodes(r: _Reader, nodes_node: yaml.Node, defaults: dict[str, Any]) -> tuple[NodeSpec, ...]:
    r.check_tag(nodes_node, "nodes")
    if not isinstance(nodes_node, yaml.SequenceNode) or not nodes_node.value:
        raise r.fail(nodes_node, "nodes", f"expected a non-empty list of nodes, got {_show(nodes_node)}")
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
            node_name = r.matching(m["name"], f"{where}.name", _LABEL_RE, _NAME_WHAT, MAX_NAME)
        elif _LABEL_RE.fullmatch(host) and len(host) <= MAX_NAME:
            node_name = host
        else:
            raise r.fail(
                m["host"],
                f"{where}.name",
                f"missing: the host {host!r} cannot be the node's name; add name: ({_NAME_WHAT})",
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


def _slurm_nodes(r: _Reader, top: dict[str, yaml.Node], defaults: dict[str, Any]) -> SlurmNodes:
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


def _node_fields(r: _Reader, m: dict[str, yaml.Node], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "transport" in m:
        out["transport"] = r.choice(m["transport"], f"{where}.transport", TRANSPORTS)
    if "user" in m:
        out["user"] = r.matching(
            m["user"],
            f"{where}.user",
            _USER_RE,
            f"a login name ([A-Za-z_][A-Za-z0-9._-]*, at most {MAX_USER})",
            MAX_USER,
        )
    if "port" in m:
        out["port"] = r.integer(m["port"], f"{where}.port", 1, 65535)
    if "python" in m:
        py = r.text(m["python"], f"{where}.python", "an absolute path or a command name")
        if not (_PY_ABS.fullmatch(py) or _PY_BARE.fullmatch(py)):
            raise r.fail(
                m["python"],
                f"{where}.python",
                "expected an absolute path or a bare command name (letters, digits, and . _ + - @ = , ~ /; "
                f"no spaces, quotes or shell characters), got {_show(m['python'])}",
            )
        out["python"] = py
    if "identity_file" in m:
        out["identity_file"] = os.path.expanduser(r.path_text(m["identity_file"], f"{where}.identity_file"))
    if "address" in m:
        out["address"] = r.address(m["address"], f"{where}.address")
    if "env" in m:
        out["env"] = r.env_map(m["env"], f"{where}.env")
    return out


def _job(r: _Reader, node: yaml.Node, path: Path) -> JobSpec:
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
            f"must be a file inside job.workdir {workdir}, got {_show(m['script'])}",
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
        exclude=tuple(r.text(n, f"job.exclude[{i}]", "a glob pattern") for i, n in enumerate(excludes)),
        resume_args=r.words(m["resume_args"], "job.resume_args") if "resume_args" in m else (),
        metrics_pattern=pattern,
    )


def _metrics_pattern(r: _Reader, node: yaml.Node, where: str) -> str:
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


def _resolve(r: _Reader, inventory_path: Path, node: yaml.Node, where: str) -> Path:
    value = r.path_text(node, where)
    p = Path(os.path.expanduser(value))
    resolved = _safe(lambda: (p if p.is_absolute() else inventory_path.parent / p).resolve())
    if resolved is None:
        raise r.fail(node, where, f"cannot resolve the path {_show(node)}")
    return resolved


def _file_path(r: _Reader, inventory_path: Path, node: yaml.Node, where: str) -> str:
    return str(_resolve(r, inventory_path, node, where))
