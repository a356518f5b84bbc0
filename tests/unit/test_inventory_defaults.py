"""Inventory defaults live in the dataclasses only: the parser leaves a missing key to them, reads
every field of every optional section, and the README's stated defaults agree with them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from mscon.agent.policy import DEFAULT_GRACE_S
from mscon.console.config.inventory import Inventory, InventoryError, RestartSpec, StopSpec, load_inventory

REPO = Path(__file__).resolve().parents[2]

BASE = """\
name: t
device_target: CPU
nodes:
  - {host: a, devices: 1}
job: {script: train.py}
"""
EVERY_KEY = """\
scheduler: {port: 9000, host: 10.0.0.1}
restart: {max_restarts: 4, backoff_s: 1.5, standby: imported, keep_warm_s: 30}
hang: {timeout_s: 30}
checks: {shm_min_gib: 2.5}
ssh: {known_hosts: kh, config: cfg, connect_timeout_s: 3, keepalive_s: 7, max_parallel_connects: 4}
stop: {grace_s: 9}
retention: {keep_runs: 3}
"""
# Inventory fields read from optional top-level sections of their own.
SECTIONS = [
    f.name
    for f in dataclasses.fields(Inventory)
    if f.default is not dataclasses.MISSING and dataclasses.is_dataclass(f.default)
]


def _load(tmp_path: Path, extra: str = "") -> Inventory:
    (tmp_path / "train.py").write_text("print('hi')\n")
    p = tmp_path / "inv.yaml"
    p.write_text(BASE + extra)
    return load_inventory(p)


def test_sections_are_the_seven_optional_ones() -> None:
    assert sorted(SECTIONS) == ["checks", "hang", "restart", "retention", "scheduler", "ssh", "stop"]


def test_missing_sections_and_keys_take_the_dataclass_defaults(tmp_path: Path) -> None:
    inv = _load(tmp_path)
    for name in SECTIONS:
        section = getattr(inv, name)
        assert section == type(section)(), name
    assert StopSpec().grace_s == DEFAULT_GRACE_S  # the agent's default when no message says
    inv = _load(tmp_path, "restart: {max_restarts: 2}\n")
    assert inv.restart == RestartSpec(max_restarts=2, backoff_s=RestartSpec.backoff_s)


def test_every_field_of_every_section_is_read(tmp_path: Path) -> None:
    inv = _load(tmp_path, EVERY_KEY)
    for name in SECTIONS:
        section = getattr(inv, name)
        for f in dataclasses.fields(section):
            assert getattr(section, f.name) != f.default, f"{name}.{f.name} not read (or not in EVERY_KEY)"
    assert inv.ssh.known_hosts == str(tmp_path / "kh") and inv.scheduler.host == "10.0.0.1"


def test_an_unknown_key_names_the_dataclass_fields(tmp_path: Path) -> None:
    known = r"restart\.bogus: unknown key \(known: backoff_s, keep_warm_s, max_restarts, standby\)"
    with pytest.raises(InventoryError, match=known):
        _load(tmp_path, "restart: {bogus: 1}\n")


def test_the_docs_state_the_dataclass_defaults(tmp_path: Path) -> None:
    inv = _load(tmp_path)
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        stated = re.findall(r"`(\w+)\.(\w+)` \(default ([0-9.]+)", page.read_text())
        for section, key, value in stated:
            assert getattr(getattr(inv, section), key) == float(value), f"{page.name}: {section}.{key}"
    usage = (REPO / "docs" / "usage.md").read_text()
    assert re.search(r"`\w+\.\w+` \(default [0-9.]+", usage), "docs/usage.md no longer states defaults"
