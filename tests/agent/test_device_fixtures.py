"""Recorded real device-tool outputs (tests/agent/data/devices/, sources in index.json) parse to the
device count, health, processes and MIG state a person reads off them; plus placeholder cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mscon.agent.checks.hccn import parse_hccn_ip, parse_hccn_link, parse_hccn_net_health
from mscon.agent.checks.smi import (
    parse_gpu_apps,
    parse_gpu_list,
    parse_gpus,
    parse_npu_smi,
    parse_smi_table,
)
from mscon.agent.checks.xid import parse_xids

DATA = Path(__file__).resolve().parent / "data" / "devices"
FIXTURES = json.loads((DATA / "index.json").read_text())["fixtures"]


def test_every_fixture_is_indexed_and_every_index_entry_exists() -> None:
    on_disk = {str(p.relative_to(DATA)) for p in DATA.glob("*/*") if p.is_file()}
    assert on_disk == {f["file"] for f in FIXTURES}
    assert sum(f["tool"] == "npu-smi info" for f in FIXTURES) >= 10
    assert sum(f["tool"].startswith("nvidia-smi") for f in FIXTURES) >= 10
    assert sum(f["tool"].startswith("kernel log") for f in FIXTURES) >= 5
    assert sum(f["tool"] == "hccn_tool" for f in FIXTURES) >= 5
    assert all(f["source"] and f["model"] and f["driver"] for f in FIXTURES)


@pytest.mark.parametrize("fx", FIXTURES, ids=[f["file"] for f in FIXTURES])
def test_fixture_parses_to_what_a_person_reads(fx: dict) -> None:
    text = (DATA / fx["file"]).read_text()
    tool = fx["tool"]
    if tool == "npu-smi info":
        table = parse_npu_smi(text)
        assert len(table.chips) == fx["devices"]
        unhealthy = {str(i): c.health for i, c in enumerate(table.chips) if c.health != "OK"}
        assert unhealthy == fx["unhealthy"]
        assert len(table.procs) == fx["processes"]
        assert table.version and table.version in fx["driver"]
        assert all(c.hbm_total for c in table.chips)  # every chip's memory pair was read
    elif tool == "nvidia-smi -L":
        gpus = parse_gpu_list(text)
        assert len(gpus) == fx["devices"]
        assert sum(len(g.migs) for g in gpus) == fx["mig_devices"]
        assert any(g.migs for g in gpus) == fx["mig"]
    elif tool == "nvidia-smi (default table)":
        t = parse_smi_table(text)
        assert len(t.gpus) == fx["devices"] and t.driver == fx["driver"]
        assert {str(g.index): g.health for g in t.gpus if g.health != "OK"} == fx["unhealthy"]
        assert any(g.mig for g in t.gpus) == fx["mig"] and t.mig_devices == fx["mig_devices"]
        assert all(g.mem_total for g in t.gpus)
    elif tool == "nvidia-smi --query-gpu":
        gpus = parse_gpus(text)
        assert len(gpus) == fx["devices"] and {g.driver for g in gpus} == {fx["driver"]}
        assert {str(g.index): g.health for g in gpus if g.health != "OK"} == fx["unhealthy"]
        assert any(g.mig for g in gpus) == fx["mig"]
        assert all(g.uuid.startswith("GPU-") and g.mem_total for g in gpus)
    elif tool == "nvidia-smi --query-compute-apps":
        apps = parse_gpu_apps(text)
        assert len(apps) == fx["processes"] and all(a.uuid.startswith("GPU-") for a in apps)
    elif tool.startswith("kernel log"):
        got = [
            {"bus": x.bus, "code": x.code, "pid": x.pid, "process": x.process, "timestamp": x.timestamp}
            for x in parse_xids(text)
        ]
        assert got == fx["xids"]
    elif tool == "hccn_tool":
        ip = parse_hccn_ip(text)
        assert parse_hccn_link(text) == fx["link"] and parse_hccn_net_health(text) == fx["net_health"]
        assert ([ip.address, ip.netmask] if ip else None) == fx["ip"]
    else:
        pytest.fail(f"no parser for {tool}")


def test_npu_ids_chips_and_layouts() -> None:
    duo = parse_npu_smi((DATA / "npu-smi/atlas300i-duo-310P3-npu64-32832-25.2.0.txt").read_text())
    assert [(c.npu, c.chip, c.device) for c in duo.chips] == [
        (64, 0, 0),
        (64, 1, 1),
        (32832, 0, 2),
        (32832, 1, 3),
    ]
    assert (duo.chips[0].hbm_used, duo.chips[0].hbm_total) == (1526, 44280)  # 310P: Memory-Usage, no HBM
    a3 = parse_npu_smi((DATA / "npu-smi/atlas-a3-910_93-8npu-16chips-procs-25.2.0.txt").read_text())
    assert [c.hccn_id for c in a3.chips] == list(range(16))  # Phy-ID
    assert a3.chips[1].label == "NPU 0 chip 1" and a3.procs[0].name == ""
    old = parse_npu_smi((DATA / "npu-smi/atlas800-3000-310x4-dev3to6-21.0.4.txt").read_text())
    assert (old.tool_version, old.version) == ("21.0.4", "21.0.4.B030")
    assert [c.device for c in old.chips] == [3, 4, 5, 6]


def test_npu_placeholders_are_unknown_not_zero() -> None:
    # The chip row of a 310P3 whose Bus-Id and AICore read NA (as npu-smi 24.1 prints in a container).
    text = (
        "| NPU   Name               | Health       | Power(W)   Temp(C)         Hugepages-Usage(page) |\n"
        "| Chip  Device             | Bus-Id       | AICore(%)  Memory-Usage(MB) |\n"
        "| 0     310P3              | OK           | 9.6        56              15 / 15 |\n"
        "| 0     0                  | NA           | NA         3398 / 11578 |\n"
    )
    (chip,) = parse_npu_smi(text).chips
    assert chip.bus == "" and (chip.hbm_used, chip.hbm_total) == (3398, 11578)


def test_gpu_placeholders_are_unknown_not_zero() -> None:
    header = "index, uuid, name, driver_version, memory.used [MiB], memory.total [MiB], utilization.gpu [%], "
    header += "ecc.errors.uncorrected.volatile.total, mig.mode.current\n"
    row = "0, GPU-a, NVIDIA GeForce RTX 4090, 550.54, 10 MiB, 24564 MiB, [N/A], [Not Supported], [N/A]\n"
    (g,) = parse_gpus(header + row)
    assert (g.util, g.ecc, g.mig, g.mem_used) == (None, None, None, 10)
    row = (
        "1, GPU-b, NVIDIA A100, 535.1, [Requested functionality has been deprecated], 81920, 0, 0, Enabled\n"
    )
    (g,) = parse_gpus(row)  # no header: GPU_FIELDS' order
    assert (g.index, g.mem_used, g.mem_total, g.ecc, g.mig) == (1, None, 81920, 0, True)
    (app,) = parse_gpu_apps("GPU-a, 4242, [N/A]\n")
    assert (app.pid, app.used_mib) == (4242, None)


def test_mig_gpu_in_the_query_and_the_table() -> None:
    q = parse_gpus((DATA / "nvidia-smi/query-gpu-linux-h100-mig-590.48.01.csv").read_text())
    assert [g.mig for g in q] == [True] and q[0].util is None  # utilization reads [N/A] under MIG
    t = parse_smi_table((DATA / "nvidia-smi/table-linux-geforce-rtx-2080-super-610.57.04.txt").read_text())
    assert t.driver == "610.57.04" and t.gpus[0].mig is None  # KMD Version; MIG M. N/A


def test_xid_line_forms_the_fixtures_lack() -> None:
    # Forms that only code comments and NVIDIA's docs show (no recorded log in the index has them):
    # no "PCI:" (older drivers), a function suffix, journalctl -o short-iso, pid=0 with an empty name.
    text = (
        "2026-03-23T00:00:00+0000 gpu-7 kernel: NVRM: Xid (0000:03:00): 14, Channel 00000001\n"
        "[ 9902.118836] NVRM: Xid (PCI:0000:90:00.0): 79, pid=0, name=, GPU has fallen off the bus.\n"
    )
    old, lost = parse_xids(text)
    assert (old.bus, old.code, old.timestamp) == ("0000:03:00", 14, "2026-03-23T00:00:00+0000")
    assert old.message == "Channel 00000001"
    assert (lost.bus, lost.code, lost.pid, lost.process) == ("0000:90:00", 79, None, None)
    assert lost.message == "GPU has fallen off the bus."
    assert parse_xids("[ 1.0] NVRM: GPU at PCI:0000:01:00: GPU-abc\n[ 2.0] NVRM: Xid is not a report\n") == ()


def test_hccn_answers_the_fixtures_lack() -> None:
    # hccn_tool's UB-connected PCIe cards print "link status : %s" (a space before the colon) and
    # two-word states (hccn_tool source, tool_ub_connect_exec); the old pattern read "PARTIAL".
    assert parse_hccn_link("link status : PARTIAL LINK\n") == "PARTIAL LINK"
    assert parse_hccn_link("vnic link status: UP\nvnic ipaddr: 192.0.2.10\n") is None  # another port
    assert parse_hccn_net_health("net health status: Receive timeout\n") == "Receive timeout"
    assert parse_hccn_link("") is None and parse_hccn_net_health("dsmi get net health fail\n") is None
