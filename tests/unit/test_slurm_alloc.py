"""Allocation discovery (console/config/slurm.py) and ``nodes: {from: slurm}``, without a Slurm cluster:
``scontrol`` and ``squeue`` are small stand-ins on PATH that answer like Slurm 22.05 does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from mscon.console.config.inventory import InventoryError, load_inventory
from mscon.console.config.slurm import (
    SLURM_TRANSPORT,
    SlurmError,
    apply_allocation,
    devices_per_node,
    discover,
)

REPO = Path(__file__).resolve().parents[2]

# scontrol show hostnames: one name per line for a comma list (enough for these tests), and
# 22.05's "Invalid hostlist" on stderr with exit 0 for a bracket it cannot read.
FAKE_SCONTROL = """#!/bin/sh
[ "$1 $2" = "show hostnames" ] || exit 1
case "$SLURM_NODELIST" in *'[x'*) echo "Invalid hostlist: $SLURM_NODELIST" >&2; exit 0;; esac
echo "$SLURM_NODELIST" | tr , '\\n'
"""
FAKE_SQUEUE = """#!/bin/sh
case "$3" in 7) echo RUNNING;; 8) echo PENDING;;
  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;; esac
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "gpu-a,gpu-b",
        "SLURM_NTASKS_PER_NODE": "4",
    }


def test_nodes_and_devices_from_the_allocation(env: dict[str, str]) -> None:
    alloc = discover(env)
    assert alloc.job_id == "7" and alloc.hosts == ("gpu-a", "gpu-b")
    assert (alloc.devices, alloc.devices_from) == (4, "SLURM_NTASKS_PER_NODE")
    assert discover({**env, "SLURM_GPUS_ON_NODE": "8"}).devices == 8  # GPUs first
    assert discover({**env, "SLURM_GPUS_ON_NODE": "8"}, given=2).devices == 2  # the inventory wins


def test_devices_per_node_sources() -> None:
    assert devices_per_node({"SLURM_TASKS_PER_NODE": "2(x3)"}, None, None) == (2, "SLURM_TASKS_PER_NODE")
    assert devices_per_node({"SLURM_TASKS_PER_NODE": "2,2"}, None, None)[0] == 2
    assert devices_per_node({"SLURM_TASKS_PER_NODE": "2,1"}, None, 3) == (3, "the inventory's nodes")
    with pytest.raises(SlurmError, match="cannot tell how many ranks"):
        devices_per_node({"SLURM_TASKS_PER_NODE": "2,1"}, None, None)
    with pytest.raises(SlurmError, match="expected a device count"):
        devices_per_node({"SLURM_GPUS_ON_NODE": "0"}, None, None)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"SLURM_JOB_ID": None}, "no Slurm allocation: SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "7; rm -rf /"}, "not a Slurm job id"),
        ({"SLURM_JOB_ID": "8"}, "Slurm job 8 (SLURM_JOB_ID) is PENDING, not RUNNING"),
        ({"SLURM_JOB_ID": "9"}, "is not known to Slurm: slurm_load_jobs error: Invalid job id"),
        ({"SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST is not set"),
        ({"SLURM_JOB_NODELIST": "a b"}, "not a Slurm node list"),
        (
            {"SLURM_JOB_NODELIST": "n[x1]"},
            "scontrol show hostnames failed for the node list 'n[x1]': Invalid",
        ),
        ({"SLURM_JOB_NODELIST": "ok,-bad"}, "'-bad' is not usable as a host"),
        ({"SLURM_JOB_NODELIST": "a,A"}, "names 'A' twice"),
        ({"SLURM_JOB_NODELIST": "1.2.3"}, "'1.2.3' is not usable"),
        ({"SLURM_NTASKS_PER_NODE": None}, "cannot tell how many ranks to start per node"),
        ({"PATH": "/nonexistent"}, "squeue is not on PATH"),
    ],
)
def test_bad_allocation_is_one_line(env: dict[str, str], change: dict[str, str | None], needle: str) -> None:
    for k, v in change.items():
        if v is None:
            env.pop(k)
        else:
            env[k] = v
    with pytest.raises(SlurmError) as err:
        discover(env)
    assert needle in str(err.value) and "\n" not in str(err.value)


def _inv(tmp_path: Path, nodes: object, **extra: object) -> Path:
    doc = {
        "name": "s",
        "device_target": "CPU",
        "defaults": {"python": "/opt/py/bin/python3", "env": {"A": "1"}},
        "nodes": nodes,
        "job": {"workdir": str(REPO), "script": "trainer/train.py"},
        **extra,
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_nodes_from_slurm_in_the_inventory(tmp_path: Path, env: dict[str, str]) -> None:
    inv = load_inventory(_inv(tmp_path, {"from": "slurm", "devices": 2}))
    assert inv.nodes == () and inv.slurm is not None and inv.slurm.devices == 2
    applied = apply_allocation(inv, env)
    assert [(n.name, n.host, n.devices, n.transport) for n in applied.nodes] == [
        ("gpu-a", "gpu-a", 2, SLURM_TRANSPORT),
        ("gpu-b", "gpu-b", 2, SLURM_TRANSPORT),
    ]
    assert all(n.python == "/opt/py/bin/python3" and n.env == {"A": "1"} for n in applied.nodes)
    assert applied.world_size == 4


def test_slurm_flag_on_a_listed_inventory(tmp_path: Path, env: dict[str, str]) -> None:
    listed = [{"host": "x1", "devices": 3}, {"host": "x2", "devices": 3}]
    inv = apply_allocation(load_inventory(_inv(tmp_path, listed)), {**env, "SLURM_NTASKS_PER_NODE": ""})
    assert [n.host for n in inv.nodes] == ["gpu-a", "gpu-b"] and inv.world_size == 6  # their common count
    mixed = [{"host": "x1", "devices": 1, "python": "/a/python"}, {"host": "x2", "devices": 1}]
    with pytest.raises(SlurmError, match="differ in python; put it in defaults"):
        apply_allocation(load_inventory(_inv(tmp_path, mixed)), env)


@pytest.mark.parametrize(
    ("nodes", "extra", "needle"),
    [
        ({"from": "pbs"}, {}, ":8:9: nodes.from: expected one of slurm, got 'pbs'"),
        ({"devices": 2}, {}, ":8:3: nodes.from: missing required key"),
        ({"from": "slurm", "devices": 0}, {}, "nodes.devices: expected a positive integer"),
        ({"from": "slurm", "host": "a"}, {}, "nodes.host"),
        (
            {"from": "slurm"},
            {"defaults": {"transport": "local"}},
            "defaults.transport: nodes from slurm are reached through srun",
        ),
    ],
)
def test_nodes_from_errors_are_one_line(tmp_path: Path, nodes: object, extra: dict, needle: str) -> None:
    with pytest.raises(InventoryError) as err:
        load_inventory(_inv(tmp_path, nodes, **extra))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_shipped_slurm_inventory() -> None:
    inv = load_inventory(REPO / "inventory" / "slurm.yaml")
    assert inv.slurm is not None and inv.nodes == () and inv.device_target == "GPU"
    sbatch = (REPO / "inventory" / "slurm-job.sbatch").read_text()
    assert "mscon run --no-tui --slurm" in sbatch and os.access(
        REPO / "inventory" / "slurm-job.sbatch", os.X_OK
    )
