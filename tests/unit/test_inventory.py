"""The inventory loader: every shipped inventory loads; every error names file:line:col and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from mscon.console.inventory import InventoryError, load_inventory

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "inventory").glob("*.yaml"))


def test_shipped_inventories_exist() -> None:
    names = {p.name for p in SHIPPED}
    assert {"local.yaml", "a100x8.yaml", "ascend910x8.yaml", "two-node.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_inventories_load(path: Path) -> None:
    inv = load_inventory(path)
    assert inv.nodes and inv.world_size >= 1
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
