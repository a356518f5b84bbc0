"""Device telemetry (agent/devices.py): nvidia-smi / npu-smi figures reach each rank's pane."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import local_inventory, mscon  # noqa: E402
from mscon.agent import protocol as P  # noqa: E402
from mscon.agent.devices import sample  # noqa: E402
from mscon.console.engine.events import from_json  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
# index, uuid, name, driver, memory.used MiB, memory.total MiB, utilization %, ECC (GPU_QUERY's order)
GPUS = (
    "0, GPU-a, NVIDIA A100-SXM4-80GB, 535.129.03, 20480, 81920, 87, 0\n"
    "1, GPU-b, NVIDIA A100-SXM4-80GB, 535.129.03, 40960, 81920, 12, 0\n"
)


def _tool(folder: Path, name: str, output: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\ncat '{output}'\n")
    tool.chmod(0o755)
    return folder


def test_gpu_figures_per_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpus.csv").write_text(GPUS)
    monkeypatch.setenv("PATH", f"{_tool(tmp_path / 'bin', 'nvidia-smi', tmp_path / 'gpus.csv')}:{os.defpath}")
    got = sample("GPU")
    assert (got[0].util, got[0].used, got[0].total) == (87.0, 20480 * 2**20, 81920 * 2**20)
    assert (got[1].util, got[1].used) == (12.0, 40960 * 2**20)


def test_npu_memory_per_chip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = DATA / "npu-smi-info-910b3x8.txt"
    monkeypatch.setenv("PATH", f"{_tool(tmp_path / 'bin', 'npu-smi', out)}:{os.defpath}")
    got = sample("Ascend")
    assert len(got) == 8 and got[0].used == 3161 * 2**20 and got[0].total == 65536 * 2**20
    assert got[0].util is None  # npu-smi info gives no utilisation in this table


def test_no_tool_or_cpu_means_no_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sample("GPU") == {} and sample("Ascend") == {} and sample("CPU") == {}


def test_ranks_get_their_own_device_in_telemetry(tmp_path: Path) -> None:
    (tmp_path / "gpus.csv").write_text(GPUS)
    tools = _tool(tmp_path / "bin", "nvidia-smi", tmp_path / "gpus.csv")
    inv = local_inventory(tmp_path / "inv.yaml", 2, "bench/fake_rank.py", ["--steps", "30", "--rate", "10"])
    doc = yaml.safe_load(inv.read_text())
    doc["device_target"] = "GPU"
    inv.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    events = tmp_path / "events.jsonl"
    done = mscon("run", "--no-tui", "-q", "--no-check", inv, "--events", events, cwd=tmp_path, env=env)
    assert done.code == 0, done.err
    seen: dict[str, tuple[float, int]] = {}
    for line in events.read_text().splitlines():
        ev = from_json(json.loads(line))
        msg = getattr(ev, "msg", None)
        for t in msg.items if isinstance(msg, P.TelemetryBatch) else ():  # a node's ranks, once a second
            if t.device_util is not None:
                seen[t.name] = (t.device_util, t.device_mem_bytes)
    assert seen.get("r0") == (87.0, 20480 * 2**20) and seen.get("r1") == (12.0, 40960 * 2**20), seen
