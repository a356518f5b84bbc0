"""A YAML number or boolean where the inventory expects a name, path or host is refused, naming the
field and the quoted spelling that was probably meant (``name: 7`` used to run as node "7",
``python: true`` as a path "true", ``known_hosts: 1.5`` as a file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mscon.console.config.inventory import InventoryError, load_inventory

# One line of the base inventory is replaced per case: (field, the line as the slip writes it).
BASE = """\
name: slips
device_target: CPU
defaults:
  python: /usr/bin/python3
  identity_file: ~/.ssh/id_ed25519
  user: train
nodes:
  - host: node-a
    name: a
    address: 10.0.0.1
    devices: 1
    env: {NODE_FLAG: x}
scheduler: {host: 10.0.0.1}
ssh:
  known_hosts: known_hosts
  config: ssh_config
job:
  workdir: work
  script: train.py
  exclude: [data]
  env: {OMP_NUM_THREADS: "4"}
"""


def _write(tmp_path: Path, old: str, new: str) -> Path:
    assert BASE.count(old) == 1, old
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "work" / "train.py").write_text("print('hi')\n")
    path = tmp_path / "inv.yaml"
    path.write_text(BASE.replace(old, new))
    return path


def test_the_base_inventory_loads(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, "name: slips", "name: slips"))
    assert inv.nodes[0].name == "a" and inv.nodes[0].python == "/usr/bin/python3"


SLIPS = [
    # (the line given, the line written instead, the field, what it expects, what it got, as written)
    ("name: slips", "name: 7", "name", "a name", "the number 7", "7"),
    ("    name: a", "    name: 7", "nodes[0].name", "a name", "the number 7", "7"),
    ("    name: a", "    name: false", "nodes[0].name", "a name", "the boolean false", "false"),
    ("  - host: node-a", "  - host: 1.5", "nodes[0].host", "a host", "the number 1.5", "1.5"),
    ("  - host: node-a", "  - host: 42", "nodes[0].host", "a host", "the number 42", "42"),
    ("  - host: node-a", "  - host: True", "nodes[0].host", "a host", "the boolean True", "True"),
    ("    address: 10.0.0.1", "    address: 7", "nodes[0].address", "an address", "the number 7", "7"),
    (
        "    address: 10.0.0.1",
        "    address: true",
        "nodes[0].address",
        "an address",
        "the boolean true",
        "true",
    ),
    (
        "scheduler: {host: 10.0.0.1}",
        "scheduler: {host: 3}",
        "scheduler.host",
        "an address",
        "the number 3",
        "3",
    ),
    ("  python: /usr/bin/python3", "  python: true", "defaults.python", "a path", "the boolean true", "true"),
    ("  python: /usr/bin/python3", "  python: 3.11", "defaults.python", "a path", "the number 3.11", "3.11"),
    (
        "  identity_file: ~/.ssh/id_ed25519",
        "  identity_file: 0x1F",
        "defaults.identity_file",
        "a path",
        "the number 0x1F",
        "0x1F",
    ),
    ("  user: train", "  user: TRUE", "defaults.user", "a login name", "the boolean TRUE", "TRUE"),
    (
        "  known_hosts: known_hosts",
        "  known_hosts: 1.5",
        "ssh.known_hosts",
        "a path",
        "the number 1.5",
        "1.5",
    ),
    ("  config: ssh_config", "  config: .inf", "ssh.config", "a path", "the number .inf", ".inf"),
    ("  workdir: work", "  workdir: 2024", "job.workdir", "a path", "the number 2024", "2024"),
    ("  workdir: work", "  workdir: 010", "job.workdir", "a path", "the number 010", "010"),
    ("  script: train.py", "  script: 1e3", "job.script", "a path", "the number 1e3", "1e3"),
    ("  script: train.py", "  script: false", "job.script", "a path", "the boolean false", "false"),
    ("  exclude: [data]", "  exclude: [data, 7]", "job.exclude[1]", "a glob pattern", "the number 7", "7"),
]


@pytest.mark.parametrize(
    ("old", "new", "field", "expects", "got", "spelled"), SLIPS, ids=[s[1].strip() for s in SLIPS]
)
def test_a_number_or_boolean_where_a_string_is_expected_is_refused(
    tmp_path: Path, old: str, new: str, field: str, expects: str, got: str, spelled: str
) -> None:
    path = _write(tmp_path, old, new)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    line = BASE.splitlines().index(old) + 1
    col = new.index(spelled) + 1
    hint = f'(quote it: "{spelled}")'
    assert str(info.value) == f"{path}:{line}:{col}: {field}: expected {expects}, got {got} {hint}"


@pytest.mark.parametrize(
    ("old", "new", "check"),
    [
        ("    name: a", '    name: "7"', lambda inv: inv.nodes[0].name == "7"),
        ("  python: /usr/bin/python3", '  python: "true"', lambda inv: inv.nodes[0].python == "true"),
        ("  known_hosts: known_hosts", '  known_hosts: "1.5"', lambda inv: inv.ssh.known_hosts[-3:] == "1.5"),
        ("  workdir: work", "  workdir: '2024'", lambda inv: inv.job.workdir.name == "2024"),
        # YAML 1.2's core schema reads these as strings: no slip (1:30 and 1_000 are YAML 1.1 numbers).
        ("  - host: node-a", "  - host: 10.0.0.7", lambda inv: inv.nodes[0].host == "10.0.0.7"),
        ("    name: a", "    name: 1_000", lambda inv: inv.nodes[0].name == "1_000"),
        ("    name: a", "    name: 7b", lambda inv: inv.nodes[0].name == "7b"),
    ],
)
def test_the_quoted_spelling_is_taken_as_written(tmp_path: Path, old: str, new: str, check: object) -> None:
    if "2024" in new:
        (tmp_path / "2024").mkdir()
        (tmp_path / "2024" / "train.py").write_text("print('hi')\n")
    inv = load_inventory(_write(tmp_path, old, new))
    assert check(inv)  # type: ignore[operator]


def test_env_values_and_args_take_numbers_and_booleans_as_written(tmp_path: Path) -> None:
    """Env values and argv words are text or numbers by design (``OMP_NUM_THREADS: 4``): kept
    exactly as written, so a rank sees ``010`` and ``True``, never 8, 10 or ``true``."""
    path = _write(
        tmp_path,
        '  env: {OMP_NUM_THREADS: "4"}',
        "  env: {OMP_NUM_THREADS: 4, MASK: 010, RATIO: 1.50, FLAG: True}\n"
        "  args: [--epochs, 3, --distribute, True]",
    )
    inv = load_inventory(path)
    assert inv.job.env == {"OMP_NUM_THREADS": "4", "MASK": "010", "RATIO": "1.50", "FLAG": "True"}
    assert inv.job.args == ("--epochs", "3", "--distribute", "True")


def test_an_env_name_that_is_a_number_is_still_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "    env: {NODE_FLAG: x}", "    env: {7: x}")
    with pytest.raises(InventoryError, match=r"nodes\[0\]\.env\.7: expected an environment variable name"):
        load_inventory(path)
