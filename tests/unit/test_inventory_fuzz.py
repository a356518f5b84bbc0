"""Hundreds of broken and hostile inventories, generated: each is refused with exactly one line
naming the file (and the field it targets), in-process and through ``validate_main`` in a
subprocess, and none of them gets anything run (a marker file would appear)."""

from __future__ import annotations

import codecs
import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mscon.console.config import inventory as inventory_module
from mscon.console.config.inventory import InventoryError, load_inventory
from mscon.console.config.limits import MAX_FILE_BYTES, MAX_NODES, MAX_WORLD_SIZE

DELETE = object()
Tree = dict[str, Any]


def base_tree() -> Tree:
    """A valid inventory using every field; values are YAML snippets, written as they are."""
    return {
        "name": "fuzz",
        "device_target": "CPU",
        "defaults": {
            "transport": "ssh",
            "user": "train",
            "port": "22",
            "python": "/usr/bin/python3",
            "identity_file": "~/.ssh/id_ed25519",
            "env": {"DEF_VAR": '"1"'},
        },
        "nodes": [
            {
                "host": "node-a",
                "name": "a",
                "devices": "2",
                "transport": "ssh",
                "user": "train",
                "port": "22",
                "python": "python3",
                "identity_file": "keys/id",
                "address": "10.0.0.1",
                "env": {"NODE_VAR": '"2"'},
            },
            {"host": "node-b.example.com", "devices": "2"},
        ],
        "scheduler": {"port": "8118", "host": "10.0.0.1"},
        "job": {
            "workdir": "WORKDIR",
            "script": "train.py",
            "args": '[--epochs, "1"]',
            "resume_args": "[--resume]",
            "env": {"JOB_VAR": '"3"'},
            "exclude": '["*.ckpt"]',
            "metrics": {"pattern": json.dumps(r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)")},
        },
        "restart": {"max_restarts": "1", "backoff_s": "2"},
        "hang": {"timeout_s": "60"},
        "checks": {"shm_min_gib": "1"},
        "ssh": {
            "known_hosts": "~/.ssh/known_hosts",
            "config": "~/.ssh/config",
            "connect_timeout_s": "10",
            "keepalive_s": "5",
            "max_parallel_connects": "4",
        },
        "stop": {"grace_s": "3"},
    }


def emit(tree: Tree, indent: int = 0) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for key, value in tree.items():
        if isinstance(value, str):
            lines.append(f"{pad}{key}: {value}")
        elif isinstance(value, dict):
            lines.append(f"{pad}{key}: {{}}" if not value else f"{pad}{key}:")
            lines += emit(value, indent + 2)
        else:
            lines.append(f"{pad}{key}:")
            for item in value:
                sub = emit(item, indent + 4) if isinstance(item, dict) else [f"{pad}    {item}"]
                sub[0] = f"{pad}  - {sub[0].lstrip()}"
                lines += sub
    return lines


def render(tree: Tree) -> str:
    return "\n".join(emit(tree)) + "\n"


def mutated(path: tuple[Any, ...], value: Any) -> str:
    tree = base_tree()
    parent: Any = tree
    for step in path[:-1]:
        parent = parent[step]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return render(tree)


def field_name(path: tuple[Any, ...]) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def q(value: str) -> str:
    """A double-quoted YAML scalar (JSON's escapes are YAML's): any string, control chars included."""
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Case:
    id: str
    text: str | bytes  # WORKDIR and MARKER are placeholders
    field: str = ""  # the field the error must name, if the case targets one


CASES: list[Case] = []


def add(case_id: str, text: str | bytes, fieldname: str = "") -> None:
    CASES.append(Case(case_id, text, fieldname))


def add_field(path: tuple[Any, ...], label: str, value: Any) -> None:
    name = field_name(path)
    add(f"{name}={label}", mutated(path, value), name)


# ---------------------------------------------------------------- numbers

INT_FIELDS = [
    ("defaults", "port"),
    ("nodes", 0, "port"),
    ("nodes", 0, "devices"),
    ("nodes", 1, "devices"),
    ("scheduler", "port"),
    ("restart", "max_restarts"),
    ("ssh", "max_parallel_connects"),
]
FLOAT_FIELDS = [
    ("stop", "grace_s"),
    ("ssh", "connect_timeout_s"),
    ("ssh", "keepalive_s"),
    ("checks", "shm_min_gib"),
    ("restart", "backoff_s"),
    ("hang", "timeout_s"),
]
BAD_NUMBERS = {
    "quoted": '"8"',
    "word": "eight",
    "list": "[1]",
    "map": "{a: 1}",
    "null": "~",
    "empty": '""',
    "true": "true",
    "yes": "yes",
    "off": "off",
    "nan": ".nan",
    "NaN": ".NaN",
    "inf": ".inf",
    "-inf": "-.inf",
    "1e999": "1e999",
    "5000digits": "9" * 5000,
    "19digits": "1" + "0" * 18,
    "negative": "-1",
    "huge": "99999999",
    "sexagesimal": "1:20",
    "octal": "010",
    "hex": "0x10",
    "0o": "0o10",
    "underscore": "1_000",
    "tag-int": "!!int 3",
    "tag-int-abc": "!!int abc",
    "tag-float": "!!float 3",
    "tag-str": "!!str 3",
    "tag-local": "!foo 3",
    "tag-nonspecific": "! 3",
    "python-tag": '!!python/object/apply:os.system ["touch MARKER"]',
}
for path in INT_FIELDS:
    for label, value in {**BAD_NUMBERS, "fraction": "2.5", "float": "2.0", "exp": "1e3"}.items():
        add_field(path, label, value)
    if path[-1] != "max_restarts":
        add_field(path, "zero", "0")
for path in FLOAT_FIELDS:
    for label, value in {**BAD_NUMBERS, "below": "-0.5", "above": "1e6"}.items():
        add_field(path, label, value)
add_field(("ssh", "connect_timeout_s"), "zero", "0")
add_field(("ssh", "keepalive_s"), "below-1", "0.5")
add_field(("hang", "timeout_s"), "below-5", "4")
add_field(("nodes", 0, "devices"), "1025", "1025")
add_field(("defaults", "port"), "65536", "65536")

# ---------------------------------------------------------------- strings with a domain

HOSTILE = {
    "space": "a b",
    "dash": "-oProxyCommand=touch MARKER",
    "subst": "$(touch MARKER)",
    "backticks": "`touch MARKER`",
    "dquote": 'a"b',
    "squote": "a'b",
    "semicolon": "a;touch MARKER",
    "newline": "a\nb",
    "cr": "a\rb",
    "nul": "a\0b",
    "ansi": "\x1b[31mred",
    "dotdot": "../../..",
    "abs": "/etc/passwd",
    "long": "a" * 5000,
    "unicode": "nöde",
    "emoji": "\U0001f600",
    "bidi": "a\u202eb",
    "empty": "",
    "blank": "   ",
    "percent": "a%b",
    "at": "root@a",
    "pipe": "a|b",
    "glob": "a*",
    "tab": "a\tb",
}
SHAPES = {
    "list": "[a]",
    "map": "{a: 1}",
    "null": "~",
    "tag": "!!str a",
    "python-tag": "!!python/name:os.system",
}
DOMAIN_FIELDS = [
    ("name",),
    ("device_target",),
    ("nodes", 0, "name"),
    ("nodes", 0, "host"),
    ("nodes", 1, "host"),
    ("nodes", 0, "user"),
    ("defaults", "user"),
    ("nodes", 0, "python"),
    ("defaults", "python"),
    ("nodes", 0, "address"),
    ("scheduler", "host"),
    ("nodes", 0, "transport"),
    ("defaults", "transport"),
]
for path in DOMAIN_FIELDS:
    for label, value in HOSTILE.items():
        if path[-1] == "python" and label == "abs":
            continue  # an absolute path is what python should be
        add_field(path, label, q(value))
    for label, value in SHAPES.items():
        add_field(path, label, value)
add_field(("nodes", 0, "python"), "spaced-path", q("/opt/my venv/bin/python"))
add_field(("nodes", 0, "python"), "relative", q("bin/python"))
add_field(("nodes", 0, "python"), "home", q("~/venv/bin/python"))
add_field(("nodes", 0, "user"), "33-chars", "a" * 33)
add_field(("nodes", 0, "name"), "65-chars", "a" * 65)
add_field(("nodes", 0, "name"), "dot", q("."))
add_field(("nodes", 0, "name"), "two-dots", q(".."))
add_field(("nodes", 0, "host"), "256-chars", "a" * 256)
add_field(("nodes", 0, "host"), "bad-ipv4", "999.1.1.1")
add_field(("nodes", 0, "host"), "scoped-ipv6", q("fe80::1%eth0"))
add_field(("nodes", 0, "host"), "bracketed-ipv6", q("[::1]"))
add_field(("nodes", 0, "address"), "underscore", "node_a")
add_field(("nodes", 0, "address"), "label-dash", "-a.example")
add_field(("device_target",), "lowercase", "gpu")

# ---------------------------------------------------------------- paths

PATH_FIELDS = [
    ("defaults", "identity_file"),
    ("nodes", 0, "identity_file"),
    ("ssh", "known_hosts"),
    ("ssh", "config"),
    ("job", "workdir"),
    ("job", "script"),
]
BAD_PATHS = {
    k: HOSTILE[k] for k in ("dash", "newline", "cr", "nul", "ansi", "bidi", "empty", "blank", "tab", "long")
}
for path in PATH_FIELDS:
    for label, value in BAD_PATHS.items():
        add_field(path, label, q(value))
    for label, value in SHAPES.items():
        add_field(path, label, value)
for label, value in {
    "outside": "../outside.py",
    "abs": "/etc/passwd",
    "dotdot": "../../..",
    "home": "~/train.py",
    "subst": "$(touch MARKER)",
    "dot": ".",
    "no-such-file": "nosuch.py",
    "option": "-c",
}.items():
    add_field(("job", "script"), label, q(value))
for label, value in {"missing": "/nonexistent/dir", "subst": "$(touch MARKER)", "a-file": "train.py"}.items():
    add_field(("job", "workdir"), label, q(value))

# ---------------------------------------------------------------- env, lists, metrics

ENV_FIELDS = [("defaults", "env"), ("nodes", 0, "env"), ("job", "env")]
BAD_ENV_KEYS = ["A B", "-x", "1A", "$(touch MARKER)", "A=B", "A\0B", "", "a.b", "Ä", "A\nB"]
BAD_ENV_VALUES = {
    "nul": q("a\0b"),
    "ansi": q("\x1b[31m"),
    "bidi": q("a\u202eb"),
    "list": "[1]",
    "map": "{a: 1}",
    "null": "~",
    "tag": "!!str x",
    "long": q("a" * 40000),
}
for path in ENV_FIELDS:
    name = field_name(path)
    for i, key in enumerate(BAD_ENV_KEYS):
        add(f"{name}.key{i}", mutated(path, {q(key): '"1"'}), name)
    for label, value in BAD_ENV_VALUES.items():
        add(f"{name}.value={label}", mutated(path, {"OK": value}), name)
    for label, value in {
        "list": "[A, B]",
        "scalar": "3",
        "tagged": '!!map {A: "1"}',
        "merge": "{<<: {A: 1}}",
    }.items():
        add_field(path, label, value)
add("job.env.duplicate", mutated(("job", "env"), {"A": "1", "A ": "2"}), "job.env")

LIST_FIELDS = [("job", "args"), ("job", "resume_args"), ("job", "exclude")]
BAD_ITEMS = {
    "nul": q("a\0b"),
    "ansi": q("\x1b[31m"),
    "nested": "[x]",
    "map": "{a: 1}",
    "null": "~",
    "tag": "!!str x",
    "python-tag": "!!python/object/apply:os.system [x]",
}
for path in LIST_FIELDS:
    name = field_name(path)
    for label, value in BAD_ITEMS.items():
        add(f"{name}.item={label}", mutated(path, f"[ok, {value}]"), name)
    for label, value in {
        "scalar": "3",
        "map": "{a: 1}",
        "string": q("--epochs 1"),
        "tagged": "!!seq [a]",
    }.items():
        add_field(path, label, value)
add_field(("job", "args"), "long-item", f"[{q('a' * 40000)}]")
add_field(("job", "args"), "too-many", "[" + ", ".join(["x"] * 1025) + "]")
NEWLINE_ITEM = q("a\nb")
add_field(("job", "exclude"), "newline", f"[{NEWLINE_ITEM}]")

for label, value in {
    "unbalanced": q("("),
    "missing-loss": q(r"(?P<step>\d+)"),
    "missing-step": q(r"(?P<loss>\d+)"),
    "overflow": q("(?P<step>a{99999999999})(?P<loss>b)"),
    "nul": q("(?P<step>\0)(?P<loss>b)"),
    "list": "[x]",
    "null": "~",
    "tag": "!!str x",
}.items():
    add_field(("job", "metrics", "pattern"), label, value)
for label, value in {
    "scalar": "3",
    "empty": "{}",
    "extra": '{pattern: "(?P<step>1)(?P<loss>2)", x: 1}',
}.items():
    add_field(("job", "metrics"), label, value)

# ---------------------------------------------------------------- structure

for path in [
    ("name",),
    ("device_target",),
    ("nodes",),
    ("job",),
    ("nodes", 0, "host"),
    ("nodes", 0, "devices"),
]:
    add_field(path, "missing", DELETE)
add_field(("job", "script"), "missing", DELETE)
for section in ["defaults", "scheduler", "job", "restart", "hang", "checks", "ssh", "stop"]:
    for label, value in {"scalar": "3", "list": "[1]", "string": "x", "null": "~", "tag": "!!map {}"}.items():
        add_field((section,), label, value)
for label, value in {"map": "{}", "empty": "[]", "scalar": "3", "null": "~", "tag": "!!seq []"}.items():
    add_field(("nodes",), label, value)
add("nodes[0]=scalar", mutated(("nodes",), ["3"]), "nodes[0]")
add("nodes[0]=list", mutated(("nodes",), ["[1]"]), "nodes[0]")
MERGED: set[tuple[Any, ...]] = set()
for path, key in [
    ((), "nodez"),
    (("defaults",), "address"),
    (("defaults",), "devices"),
    (("nodes", 0), "hostname"),
    (("scheduler",), "addr"),
    (("job",), "scrpit"),
    (("restart",), "max"),
    (("hang",), "timeout"),
    (("checks",), "shm"),
    (("ssh",), "keepalive"),
    (("stop",), "grace"),
    (("job", "metrics"), "regex"),
]:
    add_field((*path, key), "unknown-key", "1")
    if (*path, "<<") not in MERGED:
        MERGED.add((*path, "<<"))
        add_field((*path, "<<"), "merge-key", "{a: 1}")
add("nodes.duplicate-name", mutated(("nodes", 0, "name"), "node-b.example.com"), "nodes[1].name")
add_field(("nodes", 1, "name"), "duplicate-case", "A")
add_field(("ssh", "keepalive_interval_s"), "both-names", "5")

# ---------------------------------------------------------------- whole files

GOOD = render(base_tree())


def swap(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


add("empty", "")
add("comment-only", "# nothing here\n")
add("doc-marker-only", "---\n")
add("top-list", "- a\n- b\n")
add("top-scalar", "hello\n")
add("top-tagged", "--- !!map\n" + GOOD, "(top level)")
add("two-documents", GOOD + "---\nname: again\n")
add("unclosed", swap("args: [", "args: [[["))
add("tab-indent", swap("  user: train", "\tuser: train"))
add("bad-indent", swap("  port: 22", "     port: 22"))
add("undefined-alias", swap("devices: 2", "devices: *nope"))
add(
    "alias-to-map",
    swap("scheduler:\n", "scheduler: &s\n").replace('  args: [--epochs, "1"]', "  args: *s"),
    "job.args",
)
add("recursive-alias", swap("args: [--epochs", "args: &a [*a, --epochs"))
add("recursive-map", swap("  env:\n    JOB_VAR", "  env: &e\n    SELF: *e\n    JOB_VAR"))
LAUGHS = (
    "["
    + ", ".join(
        [f"&l0 [{', '.join(['lol'] * 10)}]"]
        + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    )
    + "]"
)
add("billion-laughs-args", mutated(("job", "args"), LAUGHS))
add("billion-laughs-top", "lol: " + LAUGHS + "\n" + GOOD)
add(
    "quadratic-blowup",
    "a: &a [" + ", ".join(["x"] * 1000) + "]\nb: [" + ", ".join(["*a"] * 1000) + "]\n" + GOOD,
)
for label, opener, closer in [("flow-list", "[", "]"), ("flow-map", "{a: ", "}")]:
    add(f"deep-{label}", swap('args: [--epochs, "1"]', "args: " + opener * 600 + "1" + closer * 600))
add("deep-block", GOOD + "deep:\n" + "".join("  " * (i + 1) + "a:\n" for i in range(600)))
add("deep-block-list", GOOD + "deep:\n" + "".join("  " * (i + 1) + "-\n" for i in range(600)))
DEEP_ANCHOR = "y: &d " + "[" * 25 + "1" + "]" * 25 + "\n"
add(
    "deep-alias",
    DEEP_ANCHOR
    + swap("  env:\n    JOB_VAR", "  env:\n    X: " + "[" * 20 + "*d" + "]" * 20 + "\n    JOB_VAR"),
)
add(
    "custom-tag-directive",
    "%TAG !e! tag:example.com,2000:\n---\n" + swap("name: fuzz", "name: !e!x fuzz"),
    "name",
)
add("binary-tag", swap("name: fuzz", "name: !!binary aGk="), "name")
add("set-tag", swap("devices: 2", "devices: !!set {a}"), "nodes[0].devices")
add("timestamp-tag", swap("devices: 2", "devices: !!timestamp 2001-12-14"), "nodes[0].devices")
add("tagged-key", swap("name: fuzz", "!!str name: fuzz"), "name")
add("complex-key", swap("name: fuzz", "? [a, b]\n: fuzz\nname: fuzz"))
add("merge-defaults", swap("  - host: node-a\n", "  - <<: {user: x}\n    host: node-a\n"), "nodes[0].<<")
add(
    "merge-anchor",
    swap("defaults:\n", "defaults: &d\n").replace("  - host: node-b", "  - <<: *d\n    host: node-b"),
    "nodes[1].<<",
)
add("duplicate-top-key", swap("name: fuzz\n", "name: fuzz\nname: other\n"), "name")
add("local-not-alone", swap("    transport: ssh", "    transport: local"), "nodes")
add(
    "duplicate-host",
    swap("host: node-b.example.com", "host: node-a\n    name: b\n    user: train\n    port: 22"),
    "nodes[1].host",
)
many_nodes = "".join(f"  - {{host: h{i}, devices: 1}}\n" for i in range(MAX_NODES + 1))
add("nodes-over-cap", GOOD.replace("nodes:\n", "nodes:\n" + many_nodes, 1), "nodes")
world = "".join(f"  - {{host: w{i}, devices: 1024}}\n" for i in range(MAX_WORLD_SIZE // 1024))
add("world-over-cap", GOOD.replace("nodes:\n", "nodes:\n" + world, 1), "nodes[")
add("too-large", GOOD + "#" + "x" * MAX_FILE_BYTES + "\n")

GOOD_BYTES = GOOD.encode()
add("latin1-value", GOOD_BYTES.replace(b"name: fuzz", b"name: caf\xe9"))
add("latin1-comment", b"# r\xe9sum\xe9\n" + GOOD_BYTES)
add("utf16-bom", codecs.BOM_UTF16_LE + GOOD.encode("utf-16-le"))
add("utf16-be-bom", codecs.BOM_UTF16_BE + GOOD.encode("utf-16-be"))
add("utf16-no-bom", GOOD.encode("utf-16-le"))
add("utf32", GOOD.encode("utf-32"))
add("nul-in-comment", b"# a\0b\n" + GOOD_BYTES)
add("nul-in-value", GOOD_BYTES.replace(b"name: fuzz", b"name: fu\0zz"))
add("raw-escape-char", GOOD_BYTES.replace(b"name: fuzz", b"name: \x1b[31mfuzz"))
add("raw-del-char", GOOD_BYTES.replace(b"name: fuzz", b"name: fu\x7fzz"))
add("raw-c1-char", GOOD_BYTES.replace(b"name: fuzz", "name: fu\x9bzz".encode()))
add("surrogate-bytes", GOOD_BYTES.replace(b"name: fuzz", b"name: \xed\xa0\x80"))
add("overlong-utf8", GOOD_BYTES.replace(b"name: fuzz", b"name: \xc0\xaf"))
add("truncated-utf8", GOOD_BYTES + b"# \xe2\x82")
add("escaped-surrogate", swap("name: fuzz", 'name: "\\ud800"'), "name")
add("escaped-nul", swap("name: fuzz", 'name: "fu\\0zz"'), "name")

IDS = [c.id for c in CASES]
assert len(set(IDS)) == len(IDS), [i for i in IDS if IDS.count(i) > 1]


def test_enough_cases() -> None:
    assert len(CASES) >= 300, len(CASES)


# ---------------------------------------------------------------- running them


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz")
    (d / "train.py").write_text("print('hi')\n")
    (d / "keys").mkdir()
    return d


def write_case(work: Path, index: int, case: Case) -> tuple[Path, Path]:
    path, marker = work / f"case-{index}.yaml", work / f"MARKER-{index}"
    subs = {"WORKDIR": json.dumps(str(work)), "MARKER": str(marker)}
    data = case.text
    for key, value in subs.items():
        data = (
            data.replace(key, value) if isinstance(data, str) else data.replace(key.encode(), value.encode())
        )
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path, marker


def check_message(msg: str, path: Path, fieldname: str) -> None:
    assert "\n" not in msg and "\r" not in msg and len(msg.splitlines()) == 1, repr(msg)
    assert msg.startswith(str(path)), msg
    if fieldname:
        assert re.search(rf": {re.escape(fieldname)}", msg), f"{fieldname} not named in: {msg}"
    assert "Traceback" not in msg and "cannot load" not in msg, msg


def test_the_base_inventory_is_valid(work: Path) -> None:
    path, _ = write_case(work, -1, Case("good", GOOD))
    inv = load_inventory(path)
    assert inv.world_size == 4 and inv.nodes[1].name == "node-b.example.com"
    assert inv.job.metrics_pattern and inv.job.resume_args == ("--resume",)


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_refused_with_one_line(work: Path, index: int) -> None:
    case = CASES[index]
    path, marker = write_case(work, index, case)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    check_message(str(info.value), path, case.field)
    assert not marker.exists()


def _load_in_thread(path: str) -> BaseException | None:
    """Load in a daemon thread, so a hang fails the test instead of blocking the suite."""
    result: list[BaseException | None] = []

    def target() -> None:
        try:
            load_inventory(path)
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), f"load_inventory({path!r}) hung"
    return result[0]


def special_paths(work: Path) -> list[str]:
    fifo = work / "fifo.yaml"
    if not fifo.exists():
        os.mkfifo(fifo)
    zero_link = work / "zero.yaml"
    if not zero_link.exists():
        zero_link.symlink_to("/dev/zero")
    loop = work / "loop.yaml"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    return [
        str(fifo),
        "/dev/zero",
        str(zero_link),
        str(work),
        str(work / "absent.yaml"),
        str(loop),
        str(work / ("x" * 300)),
    ]


def test_special_files_are_refused_promptly(work: Path) -> None:
    for path in special_paths(work):
        exc = _load_in_thread(path)
        assert isinstance(exc, InventoryError), (path, exc)
        check_message(str(exc), Path(path), "")
    exc = _load_in_thread(str(work / "a\0b.yaml"))
    assert isinstance(exc, InventoryError) and "\n" not in str(exc)


def test_nothing_escapes_the_loader(monkeypatch: pytest.MonkeyPatch, work: Path) -> None:
    """A bug inside the build still comes out as one InventoryError line."""

    def boom(*_: object) -> None:
        raise KeyError("boom\nsecond line")

    monkeypatch.setattr(inventory_module, "_build", boom)
    path, _ = write_case(work, -2, Case("good", GOOD))
    with pytest.raises(InventoryError, match="cannot load: KeyError") as info:
        load_inventory(path)
    assert "\n" not in str(info.value)


SUBPROCESS_CODE = (
    "import sys; from mscon.console.cli.validate import validate_main; sys.exit(validate_main(sys.argv[1:]))"
)


def test_validate_main_in_a_subprocess(work: Path) -> None:
    """About 20 cases, spread over the kinds, each through its own `validate_main` process."""
    step = max(1, len(CASES) // 18)
    paths = [str(write_case(work, i, CASES[i])[0]) for i in range(0, len(CASES), step)]
    paths += special_paths(work)[:2]
    import_root = Path(inventory_module.__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(import_root), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SUBPROCESS_CODE, p],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for p in paths
    ]
    for path, proc in zip(paths, procs, strict=True):
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 2, (path, proc.returncode, err)
        assert out == "" and "Traceback" not in err, (path, err)
        assert len(err.splitlines()) == 1 and err.startswith(path), (path, err)
    assert len(paths) >= 20
