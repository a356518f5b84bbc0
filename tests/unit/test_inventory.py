"""The inventory loader: every shipped inventory loads; every error names file:line:col and field."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mscon.console.cli.validate import validate_main
from mscon.console.config import inventory as inventory_module
from mscon.console.config.inventory import HangSpec, InventoryError, RestartSpec, load_inventory
from mscon.console.config.limits import MAX_FILE_BYTES, MAX_NODES, MAX_WORLD_SIZE

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "inventory").glob("*.yaml"))


def test_shipped_inventories_exist() -> None:
    names = {p.name for p in SHIPPED}
    assert {"local.yaml", "a100x8.yaml", "ascend910x8.yaml", "two-node.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_inventories_load(path: Path) -> None:
    inv = load_inventory(path)
    assert (inv.nodes and inv.world_size >= 1) or inv.slurm is not None  # slurm: nodes at run time
    assert (inv.job.workdir / inv.job.script).is_file()


def test_a100_and_ascend_shapes() -> None:
    a100 = load_inventory(REPO / "inventory" / "a100x8.yaml")
    assert a100.device_target == "GPU" and a100.world_size == 8
    ascend = load_inventory(REPO / "inventory" / "ascend910x8.yaml")
    assert ascend.device_target == "Ascend" and ascend.world_size == 8
    two = load_inventory(REPO / "inventory" / "two-node.yaml")
    assert len(two.nodes) == 2


GOOD = """\
name: t
device_target: CPU
defaults: {user: train, port: 2222, python: /opt/venv/bin/python3}
nodes:
  - {host: a, devices: 2}
  - {host: b, devices: 2, port: 22}
job:
  workdir: {workdir}
  script: train.py
  args: [--epochs, 3]
  env: {GLOG_v: 2}
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    p = tmp_path / "inv.yaml"
    p.write_text(text.replace("{workdir}", str(tmp_path)))
    return p


def test_good_inventory_and_defaults(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, GOOD))
    a, b = inv.nodes
    assert (a.user, a.port, a.python) == ("train", 2222, "/opt/venv/bin/python3")
    assert b.port == 22 and b.name == "b"
    assert inv.job.args == ("--epochs", "3") and inv.job.env == {"GLOG_v": "2"}
    assert inv.scheduler.port == 8118 and inv.world_size == 4


@pytest.mark.parametrize(
    ("old", "new", "where", "words"),
    [
        (
            "devices: 2}\n  - {host: b",
            'devices: "eight"}\n  - {host: b',
            ":5:",
            ["nodes[0].devices", "positive integer", "'eight'"],
        ),
        ("devices: 2}\n  - {host: b", "devices: 0}\n  - {host: b", ":5:", ["nodes[0].devices", "got 0"]),
        (
            "{host: b, devices: 2, port: 22}",
            "{host: a, devices: 2}",
            ":6:",
            ["nodes[1].host", "duplicate host 'a'"],
        ),
        ("name: t\n", "name: t\nnodez: 1\n", ":2:1", ["nodez", "unknown key"]),
        ("  script: train.py", "  script: missing.py", ":9:", ["job.script", "no such file"]),
        ("device_target: CPU", "device_target: TPU", ":2:", ["device_target", "GPU, Ascend, CPU"]),
        ("port: 2222", "port: 70000", ":3:", ["defaults.port", "1..65535"]),
        ("  args: [--epochs, 3]", "  args: {a: 1}", ":10:", ["job.args", "expected a list"]),
        ("{host: a, devices: 2}", "{host: a}", ":5:", ["nodes[0].devices", "missing required key"]),
        ("workdir: {workdir}", "workdir: /nonexistent/dir", ":8:", ["job.workdir", "no such directory"]),
    ],
)
def test_errors_name_line_and_field(tmp_path: Path, old: str, new: str, where: str, words: list[str]) -> None:
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}{where}"), msg
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_yaml_syntax_error_has_position(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("nodes:\n", "nodes: [\n", 1))
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value).startswith(f"{path}:") and "invalid YAML" in str(info.value)


def test_duplicate_key_and_missing_file(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("name: t\n", "name: t\nname: u\n", 1))
    with pytest.raises(InventoryError, match=r":2:1: name: duplicate key"):
        load_inventory(path)
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "nope.yaml")


def test_local_node_must_be_alone(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("{host: a, devices: 2}", "{host: a, devices: 2, transport: local}"))
    with pytest.raises(InventoryError, match="local node must be the only node"):
        load_inventory(path)


# ---------------------------------------------------------------- hostile and broken inputs


def _refused(tmp_path: Path, text: str, fieldname: str, *words: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and msg.startswith(f"{path}:"), msg
    assert f": {fieldname}: " in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


@pytest.mark.parametrize(
    "name", ["../../../..", "/etc/cron.d/x", "a/b", "-rf", ".hidden", "..", "a b", "a\\nb", "x" * 65]
)
def test_node_names_that_could_escape_or_confuse_are_refused(tmp_path: Path, name: str) -> None:
    text = GOOD.replace("{host: a, devices: 2}", f'{{host: a, name: "{name}", devices: 2}}')
    _refused(tmp_path, text, "nodes[0].name")


@pytest.mark.parametrize(
    "host",
    ["a b", "-oProxyCommand=touch /tmp/pwned", "$(touch /tmp/pwned)", "root@a", "a%b", "[::1]", "999.0.0.1"],
)
def test_hosts_that_ssh_would_misread_are_refused(tmp_path: Path, host: str) -> None:
    _refused(tmp_path, GOOD.replace("{host: a,", f'{{host: "{host}",'), "nodes[0].host")


def test_ip_literals_and_aliases_are_fine_hosts(tmp_path: Path) -> None:
    text = GOOD.replace("{host: a,", "{host: '::1', name: v6,").replace("{host: b,", "{host: my_alias.lab-1,")
    inv = load_inventory(_write(tmp_path, text))
    assert [(n.name, n.host) for n in inv.nodes] == [("v6", "::1"), ("my_alias.lab-1", "my_alias.lab-1")]
    _refused(tmp_path, GOOD.replace("{host: a,", "{host: '::1',"), "nodes[0].name", "add name:")


@pytest.mark.parametrize(
    "python",
    ["/opt/venv/bin/python3; touch /tmp/x", "'/opt/venv/bin/python3'", "/opt/my venv/python", "bin/py"],
)
def test_python_must_be_a_plain_path_or_command(tmp_path: Path, python: str) -> None:
    _refused(
        tmp_path, GOOD.replace("python: /opt/venv/bin/python3", f"python: {python!r}"), "defaults.python"
    )


def test_users_env_names_and_addresses_have_domains(tmp_path: Path) -> None:
    _refused(tmp_path, GOOD.replace("user: train", "user: '-oProxy'"), "defaults.user", "login name")
    _refused(tmp_path, GOOD.replace("GLOG_v: 2", "'LD PRELOAD': 2"), "job.env.'LD PRELOAD'", "variable name")
    _refused(tmp_path, GOOD.replace("{host: a,", "{host: a, address: 'x y',"), "nodes[0].address")
    _refused(tmp_path, GOOD.replace("{host: a,", '{host: a, env: {X: "\\e[2J"},'), "nodes[0].env.X", "U+001B")


def test_names_with_newlines_cannot_forge_lines(tmp_path: Path) -> None:
    msg = _refused(tmp_path, GOOD.replace("name: t", 'name: "t\\nok: fake"'), "name", "line break")
    assert "ok: fake" not in msg


def test_script_must_stay_inside_the_workdir(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "outside.py").write_text("print('outside')\n")
    (work / "link.py").symlink_to(tmp_path / "outside.py")
    base = GOOD.replace("workdir: {workdir}", f"workdir: {work}")
    for script in ["../outside.py", "link.py", "sub/../../outside.py"]:
        _refused(
            tmp_path,
            base.replace("script: train.py", f"script: {script}"),
            "job.script",
            "inside job.workdir",
        )
    _refused(
        tmp_path, base.replace("script: train.py", f"script: {tmp_path}/outside.py"), "job.script", "relative"
    )
    _refused(
        tmp_path, base.replace("script: train.py", "script: -c"), "job.script", "must not start with '-'"
    )
    (work / "train.py").write_text("")
    (work / "inner.py").symlink_to(work / "train.py")
    inv = load_inventory(_write(tmp_path, base.replace("script: train.py", "script: ./inner.py")))
    assert inv.job.script == "./inner.py" and inv.job.workdir == work.resolve()


@pytest.mark.parametrize("value", [".nan", ".NaN", ".inf", "-.inf", "1e999"])
def test_non_finite_numbers_are_refused(tmp_path: Path, value: str) -> None:
    _refused(tmp_path, GOOD + f"stop: {{grace_s: {value}}}\n", "stop.grace_s", "finite", value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1:20", ["ambiguous", "base-60 number 80", "plain decimal", "quote"]),
        ("010", ["ambiguous", "octal 8", "without leading zeros", "quote"]),
        ("0x10", ["ambiguous", "plain decimal"]),
        ("1_0", ["underscores"]),
        ("9" * 5000, ["too many digits"]),
        ("yes", ["positive integer", "'yes'"]),
    ],
)
def test_yaml_1_1_numbers_are_refused_not_guessed(tmp_path: Path, value: str, words: list[str]) -> None:
    text = GOOD.replace("{host: a, devices: 2}", f"{{host: a, devices: {value}}}")
    _refused(tmp_path, text, "nodes[0].devices", *words)


def test_strings_keep_the_text_as_written(tmp_path: Path) -> None:
    text = GOOD.replace(
        "args: [--epochs, 3]", "args: [--mode, 1:20, --umask, 010, --flag, yes, --lr, 1.50, ~x]"
    )
    inv = load_inventory(_write(tmp_path, text.replace("GLOG_v: 2", "UMASK: 022, ON: on")))
    assert inv.job.args == ("--mode", "1:20", "--umask", "010", "--flag", "yes", "--lr", "1.50", "~x")
    assert inv.job.env == {"UMASK": "022", "ON": "on"}


@pytest.mark.parametrize(
    ("value", "fieldname"),
    [
        ("!!int 3", "nodes[0].devices"),
        ("!!python/object/apply:os.system ['touch /tmp/pwned']", "nodes[0].devices"),
        ("!foo 3", "nodes[0].devices"),
    ],
)
def test_explicit_tags_are_refused_by_name(tmp_path: Path, value: str, fieldname: str) -> None:
    text = GOOD.replace("{host: a, devices: 2}", f"{{host: a, devices: {value}}}")
    _refused(tmp_path, text, fieldname, "explicit YAML tags are not supported")


def test_merge_keys_are_refused_by_name(tmp_path: Path) -> None:
    text = GOOD.replace("nodes:\n  - {host: a,", "nodes:\n  - {<<: {user: x}, host: a,")
    _refused(tmp_path, text, "nodes[0].<<", "YAML merge keys (<<) are not supported")


def test_aliases_work_but_cannot_explode(tmp_path: Path) -> None:
    text = GOOD.replace("{host: a, devices: 2}", "{host: a, devices: 2, env: &e {K: v}}")
    inv = load_inventory(_write(tmp_path, text.replace("{host: b,", "{host: b, env: *e,")))
    assert inv.nodes[0].env == inv.nodes[1].env == {"K": "v"}
    laughs = (
        "["
        + ", ".join(
            ["&l0 [" + ", ".join(["x"] * 10) + "]"]
            + [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
        )
        + "]"
    )
    msg = _refused_anywhere(tmp_path, GOOD.replace("args: [--epochs, 3]", f"args: {laughs}"))
    assert "once aliases are expanded" in msg
    msg = _refused_anywhere(tmp_path, GOOD.replace("args: [--epochs, 3]", "args: &a [*a]"))
    assert "recursive alias" in msg


def _refused_anywhere(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "inv.yaml"
    (tmp_path / "train.py").write_text("print('hi')\n")
    raw = text if isinstance(text, bytes) else text.replace("{workdir}", str(tmp_path)).encode()
    path.write_bytes(raw)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and msg.startswith(str(path)), msg
    return msg


def test_bounded_input(tmp_path: Path) -> None:
    assert "nested deeper than 32" in _refused_anywhere(tmp_path, "a: " + "[" * 600 + "]" * 600 + "\n")
    assert "file too large" in _refused_anywhere(tmp_path, GOOD + "#" * MAX_FILE_BYTES)
    assert "not valid UTF-8 (byte 0xe9)" in _refused_anywhere(tmp_path, b"name: caf\xe9\n")
    assert "UTF-16" in _refused_anywhere(tmp_path, GOOD.encode("utf-16"))
    assert ":2:4: contains a NUL byte" in _refused_anywhere(tmp_path, b"a: 1\nb: \0\n")
    many = "".join(f"  - {{host: h{i}, devices: 1}}\n" for i in range(MAX_NODES - 1))  # and GOOD's two
    said = f"too many nodes: {MAX_NODES + 1} (at most {MAX_NODES})"
    assert said in _refused_anywhere(tmp_path, GOOD.replace("nodes:\n", "nodes:\n" + many))
    world = "".join(f"  - {{host: h{i}, devices: 1024}}\n" for i in range(MAX_WORLD_SIZE // 1024 + 1))
    assert f"world size exceeds {MAX_WORLD_SIZE}" in _refused_anywhere(
        tmp_path, GOOD.replace("nodes:\n", "nodes:\n" + world)
    )


def _load_with_timeout(path: Path | str, timeout_s: float = 5.0) -> BaseException | None:
    result: list[BaseException | None] = []

    def target() -> None:
        try:
            load_inventory(path)
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"load_inventory({path}) hung"
    return result[0]


def test_fifo_and_devices_are_refused_promptly(tmp_path: Path) -> None:
    fifo = tmp_path / "inv.yaml"
    os.mkfifo(fifo)
    for path, kind in [
        (fifo, "a FIFO"),
        (Path("/dev/zero"), "a character device"),
        (tmp_path, "a directory"),
    ]:
        started = time.monotonic()
        exc = _load_with_timeout(path)
        assert isinstance(exc, InventoryError) and f"not a regular file ({kind})" in str(exc), exc
        assert time.monotonic() - started < 2


def test_new_fields_and_their_defaults(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, GOOD))
    assert inv.restart == RestartSpec(max_restarts=0, backoff_s=2.0)
    assert inv.hang == HangSpec(timeout_s=None)  # derived from each rank's pace (policy.HangRule)
    assert inv.ssh.keepalive_s == 5.0 and inv.ssh.keepalive_interval_s == 5.0
    assert inv.job.resume_args == () and inv.job.metrics_pattern is None
    extra = (
        "  resume_args: [--resume, auto]\n"
        "  metrics: {pattern: 'step (?P<step>\\d+) loss (?P<loss>[0-9.]+)'}\n"
        "restart: {max_restarts: 3, backoff_s: 0.5}\n"
        "hang: {timeout_s: 600}\n"
        "ssh: {keepalive_interval_s: 30}\n"
    )
    inv = load_inventory(_write(tmp_path, GOOD + extra))
    assert inv.restart == RestartSpec(max_restarts=3, backoff_s=0.5) and inv.hang.timeout_s == 600.0
    assert inv.ssh.keepalive_s == 30.0 and inv.job.resume_args == ("--resume", "auto")
    assert inv.job.metrics_pattern and re.match(inv.job.metrics_pattern, "step 7 loss 0.5")
    _refused(tmp_path, GOOD + "hang: {timeout_s: 4}\n", "hang.timeout_s", "5..86400")
    _refused(tmp_path, GOOD + "restart: {max_restarts: 1001}\n", "restart.max_restarts", "0..1000")
    _refused(tmp_path, GOOD + "ssh: {keepalive_s: 0}\n", "ssh.keepalive_s", "1..300")
    _refused(
        tmp_path, GOOD + "  metrics: {pattern: '(?P<step>\\d+)'}\n", "job.metrics.pattern", "missing: loss"
    )
    _refused(
        tmp_path, GOOD + "  metrics: {pattern: '(?P<step>'}\n", "job.metrics.pattern", "not a valid regular"
    )


def test_validate_main(tmp_path: Path) -> None:
    bad = _write(tmp_path, GOOD.replace("devices: 2}\n  - {host: b", "devices: 1:20}\n  - {host: b"))
    out, err = io.StringIO(), io.StringIO()
    assert validate_main([str(p) for p in SHIPPED], out, err) == 0
    assert err.getvalue() == "" and "ok: " in out.getvalue() and "(2 nodes, 8 ranks)" in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert validate_main([str(SHIPPED[0]), str(bad), "/dev/zero"], out, err) == 2
    assert len(out.getvalue().splitlines()) == 1
    lines = err.getvalue().splitlines()
    assert len(lines) == 2 and "nodes[0].devices" in lines[0] and lines[1].startswith("/dev/zero:")
    assert validate_main([], out, io.StringIO()) == 2


def test_validate_main_survives_a_loader_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    import mscon.console.cli.validate as validate_module

    def broken(path: str) -> None:
        raise ZeroDivisionError("boom\nline two")

    monkeypatch.setattr(validate_module, "load_inventory", broken)
    err = io.StringIO()
    assert validate_main(["x.yaml"], io.StringIO(), err) == 2
    assert err.getvalue() == "x.yaml: internal error: ZeroDivisionError: boom\\nline two\n"


def test_validate_main_as_a_process(tmp_path: Path) -> None:
    bad = _write(tmp_path, GOOD.replace("name: t", 'name: "\\e[31mred"'))
    code = (
        "import sys; from mscon.console.cli.validate import validate_main; "
        "sys.exit(validate_main(sys.argv[1:]))"
    )
    import_root = Path(inventory_module.__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(import_root), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", code, str(SHIPPED[0]), str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert run.stdout == f"ok: {SHIPPED[0]} (1 node, {load_inventory(SHIPPED[0]).world_size} ranks)\n"
    assert run.stderr == f"{bad}:1:7: name: contains a control character (U+001B)\n"
