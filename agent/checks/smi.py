"""The device tools' outputs, parsed: shared by the ``devices`` checks and the rank panes' telemetry
(agent/devices.py), so the two never disagree about a format. Pure functions, text in, frozen
dataclasses out; running the tools is the callers' job. tests/agent/data/devices/ holds recorded real
outputs (index.json names each one's source) and the tests parse every one of them.

Placeholders (``[N/A]``, ``N/A``, ``NA``, ``-``, ``[Not Supported]``, ``[Unknown Error]``,
``[Requested functionality has been deprecated]``, ``ERR!``) read as unknown (None), never as 0.

nvidia-smi:
- ``--query-gpu=<GPU_FIELDS> --format=csv,nounits``: a header line, then one CSV line per GPU; the
  header maps the columns by name (``memory.used [MiB]`` without nounits), so a field list or order
  that differs across drivers does not shift values. Lines without a header (``noheader``) are read in
  GPU_FIELDS' order.
- ``--query-compute-apps=gpu_uuid,pid,used_memory``: one line per compute process, nothing when idle.
- ``-L``: ``GPU 0: NAME (UUID: GPU-...)``, and under a GPU in MIG mode one line per MIG device,
  ``  MIG 1g.10gb     Device  0: (UUID: MIG-...)`` (padding differs across drivers).
- the default table: ``Driver Version`` (``KMD Version`` from driver 610), one block per GPU whose
  last line holds the MIG mode (``Enabled``/``Disabled``/``N/A``), a ``MIG devices:`` table.

npu-smi info: the box table of the Ascend driver, in three row layouts: 910/910B ``Chip | Bus-Id |
AICore(%) Memory-Usage(MB) HBM-Usage(MB)``; Atlas A3 (910_93) ``Chip  Phy-ID | ...`` with two chips
per NPU; 310/310P ``Chip  Device | ... Memory-Usage(MB)`` without HBM (one to four chips per NPU).
Per chip two rows: ``| NPU  Name | Health | Power(W) Temp(C) Hugepages-Usage(page) |`` then ``| Chip
[Phy-ID|Device] | Bus-Id | AICore(%) memory pairs |``; NPU ids are the board's (0, 6, 64, 215,
32832...), not 0..N-1. Then a process table (``No running processes found in NPU N`` when idle,
a ``Process id in container`` column from 26.x). Health is OK, Warning, Alarm or Critical.

A device, as ranks see it, is a chip: ASCEND_RT_VISIBLE_DEVICES and MindSpore's device_id count
logical devices, one per chip (16 on an 8-NPU A3 board, 2 per Atlas 300I Duo card), in npu-smi's
order. On a GPU in MIG mode the ranks see its MIG devices, not the GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# Anything bracketed is nvidia-smi's way of saying "no value" ([N/A], [Not Supported], [Unknown Error],
# [Requested functionality has been deprecated], [GPU requires reset], ...); npu-smi says NA or -.
_NOT_A_NUMBER = re.compile(r"^(\[.*\]|N/?A|-+|ERR!|Unknown|Not Supported)$", re.I)


def num(s: str) -> int | None:
    s = s.strip()
    if not s or _NOT_A_NUMBER.match(s):
        return None
    m = re.match(r"^-?\d+", s)
    return int(m.group(0)) if m else None


def known(s: str) -> str:
    """The text of a field, "" where the tool printed a placeholder."""
    s = s.strip()
    return "" if _NOT_A_NUMBER.match(s) else s


# ------------------------------------------------------------------ nvidia-smi --query-*

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "ecc.errors.uncorrected.volatile.total",
    "mig.mode.current",
)
GPU_QUERY = "--query-gpu=" + ",".join(GPU_FIELDS)
GPU_FORMAT = "--format=csv,nounits"  # with its header: columns are found by name


@dataclass(frozen=True)
class Gpu:
    index: int | None
    uuid: str
    name: str
    driver: str
    mem_used: int | None  # MiB
    mem_total: int | None
    util: int | None  # percent
    ecc: int | None  # uncorrected, volatile
    mig: bool | None = None  # MIG mode; None where the GPU has none

    @property
    def health(self) -> str:
        return "ECC" if self.ecc else "OK"


_HEADER_NAME = re.compile(r"^[a-z_][a-z0-9_.]*(\s*\[[^\]]*\])?$", re.I)


def _csv(text: str) -> tuple:
    """(column names or None, rows of stripped fields) of nvidia-smi's csv; units are cut from names."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None, []
    first = [f.strip() for f in lines[0].split(",")]
    if all(_HEADER_NAME.match(f) for f in first) and not first[0][:1].isdigit():
        names = [re.sub(r"\s*\[.*\]$", "", f) for f in first]
        return names, [[f.strip() for f in ln.split(",")] for ln in lines[1:]]
    return None, [[f.strip() for f in ln.split(",")] for ln in lines]


def _by_name(names: list, fields: list, text_field: str) -> dict:
    """A row as {column: value}; where a value held commas (a GPU or process name), the extra fields
    are joined back into text_field."""
    extra = len(fields) - len(names)
    if extra > 0 and text_field in names:
        at = names.index(text_field)
        fields = fields[:at] + [",".join(fields[at : at + extra + 1])] + fields[at + extra + 1 :]
    return dict(zip(names, fields))


def _mig(value: str) -> bool | None:
    v = value.strip().lower()
    return True if v == "enabled" else False if v == "disabled" else None


def parse_gpus(text: str) -> list:
    """Gpu per line of --query-gpu output (with or without its header)."""
    names, rows = _csv(text)
    gpus = []
    for fields in rows:
        row = _by_name(names or list(GPU_FIELDS[: max(len(fields), 8)]), fields, "name")
        if num(row.get("index", "")) is None:
            continue
        gpus.append(
            Gpu(
                index=num(row["index"]),
                uuid=row.get("uuid", ""),
                name=row.get("name", ""),
                driver=known(row.get("driver_version", "")),
                mem_used=num(row.get("memory.used", "")),
                mem_total=num(row.get("memory.total", "")),
                util=num(row.get("utilization.gpu", "")),
                ecc=num(row.get("ecc.errors.uncorrected.volatile.total", "")),
                mig=_mig(row.get("mig.mode.current", "")),
            )
        )
    return gpus


@dataclass(frozen=True)
class GpuApp:
    uuid: str
    pid: int
    used_mib: int | None  # None where the driver does not say (WDDM, containers)


def parse_gpu_apps(text: str) -> list:
    """GpuApp per compute process of --query-compute-apps (gpu_uuid,pid,used_memory or a header)."""
    names, rows = _csv(text)
    apps = []
    for fields in rows:
        row = _by_name(names or ["gpu_uuid", "pid", "used_memory"], fields, "process_name")
        pid = num(row.get("pid", ""))
        if pid is None:
            continue
        used = row.get("used_memory", row.get("used_gpu_memory", ""))
        apps.append(GpuApp(row.get("gpu_uuid", ""), pid, num(used)))
    return apps


# ------------------------------------------------------------------ nvidia-smi -L


@dataclass(frozen=True)
class MigDevice:
    profile: str  # 1g.10gb, 1c.3g.71gb, ...
    device: int
    uuid: str


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str
    migs: tuple = ()  # MigDevice, where the GPU is in MIG mode and has instances


_L_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")
_L_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID: ([^)]+)\)\s*$")


def parse_gpu_list(text: str) -> list:
    gpus: list = []
    for line in text.splitlines():
        m = _L_GPU.match(line)
        if m:
            gpus.append(ListedGpu(int(m.group(1)), m.group(2), m.group(3)))
            continue
        m = _L_MIG.match(line)
        if m and gpus:
            mig = MigDevice(m.group(1), int(m.group(2)), m.group(3))
            gpus[-1] = replace(gpus[-1], migs=gpus[-1].migs + (mig,))
    return gpus


# ------------------------------------------------------------------ nvidia-smi (the default table)


@dataclass(frozen=True)
class TableGpu:
    index: int
    name: str  # as the table prints it: long names are cut ("NVIDIA GeForce RTX 2080 ...")
    bus: str
    mem_used: int | None = None  # MiB
    mem_total: int | None = None
    util: int | None = None
    ecc: int | None = None
    mig: bool | None = None
    error: bool = False  # a field read ERR! or the GPU is lost: the driver cannot talk to it

    @property
    def health(self) -> str:
        return "ERR" if self.error else "ECC" if self.ecc else "OK"


@dataclass(frozen=True)
class SmiTable:
    driver: str
    cuda: str
    gpus: tuple
    mig_devices: int  # rows of the "MIG devices:" table
    processes: int


_T_HEAD = re.compile(r"NVIDIA-SMI\s+(\S+)\s+(?:Driver|KMD) Version:\s*(\S+)\s+CUDA(?: UMD)? Version:\s*(\S+)")
# Persistence-M (On/Off) on Linux, the driver model (WDDM/TCC/MCDM) on Windows.
_T_GPU = re.compile(
    r"^\|\s*(\d+)\s+(.+?)\s+(?:On|Off|WDDM|TCC|MCDM)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)"
)
_T_MEM = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")


def parse_smi_table(text: str) -> SmiTable:
    driver = cuda = ""
    gpus: list = []
    section = "gpus"
    mig_rows = procs = 0
    for line in text.splitlines():
        m = _T_HEAD.search(line)
        if m:
            driver, cuda = m.group(2), m.group(3)
            continue
        if "MIG devices:" in line:
            section = "mig"
            continue
        if "Processes:" in line:
            section = "procs"
            continue
        if not line.startswith("|") or line.startswith("|="):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if section == "gpus":
            m = _T_GPU.match(line)
            if m:
                ecc = num(cells[2]) if len(cells) > 2 else None
                gpus.append(TableGpu(int(m.group(1)), m.group(2).strip(), m.group(3), ecc=ecc))
                continue
            if not gpus:
                continue
            last = gpus[-1]
            if "ERR!" in line or "GPU is lost" in line:
                last = replace(last, error=True)
            pair = _T_MEM.search(line)
            if pair and last.mem_total is None:
                util = num(cells[2].split()[0]) if len(cells) > 2 and cells[2] else None
                last = replace(last, mem_used=int(pair.group(1)), mem_total=int(pair.group(2)), util=util)
            elif len(cells) == 3 and not cells[0] and not cells[1] and cells[2]:
                last = replace(last, mig=_mig(cells[2]))
            gpus[-1] = last
        elif section == "mig" and re.match(r"^\|\s*\d+\s+\d+\s+\d+\s+\d+\s*\|", line):
            mig_rows += 1
        elif section == "procs" and re.match(r"^\|\s*\d+\s", line):
            procs += 1
    return SmiTable(driver, cuda, tuple(gpus), mig_rows, procs)


# ------------------------------------------------------------------ npu-smi info

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_NPU_ROW = re.compile(r"^(\d+)\s+(\S.*)$")
_CHIP_ROW = re.compile(r"^(\d+)(?:\s+(\d+))?$")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
NPU_HEALTH = ("OK", "Warning", "Alarm", "Critical")  # npu-smi's words, least to most serious


@dataclass(frozen=True)
class Npu:
    """One chip of npu-smi info: a logical device as the ranks see it."""

    npu: int  # the board's NPU id (0, 6, 64, 215, 32832, ...)
    name: str
    health: str  # npu-smi's word: OK, Warning, Alarm, Critical; "" where unknown
    chip: int = 0
    phy: int | None = None  # Phy-ID (A3 layout): the id hccn_tool -i takes there
    device: int | None = None  # Device column (310/310P layout)
    bus: str = ""  # "" where npu-smi prints NA
    hbm_used: int | None = None  # MB: HBM where the table has it, else Memory-Usage (310 DDR)
    hbm_total: int | None = None

    @property
    def label(self) -> str:
        return "NPU %d chip %d" % (self.npu, self.chip)

    @property
    def hccn_id(self) -> int:
        """The id hccn_tool -i takes: the chip's Phy-ID (or Device id) where shown, else the NPU id."""
        for i in (self.phy, self.device):
            if i is not None:
                return i
        return self.npu


@dataclass(frozen=True)
class NpuProc:
    npu: int
    chip: int
    pid: int
    name: str  # "" where npu-smi leaves it blank


@dataclass(frozen=True)
class NpuSmi:
    version: str  # "Version:" of the header (the driver's), e.g. 21.0.4.B030
    tool_version: str  # "npu-smi X" of the header, which may differ (21.0.4)
    chips: tuple  # Npu, in npu-smi's order: logical device i is chips[i]
    procs: tuple  # NpuProc


def parse_npu_smi(text: str) -> NpuSmi:
    version = tool_version = ""
    chips: list = []
    procs: list = []
    section = ""
    second_id = ""  # what the chip row's second number is: "Phy-ID", "Device" or nothing
    pending: Npu | None = None
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("|"):
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if not version:
            m = re.search(r"npu-smi\s+(\S+)\s+Version:\s*(\S+)", s)
            if m:
                tool_version, version = m.group(1), m.group(2)
                continue
        if cells[0].startswith("NPU") and any(c.startswith("Process id") for c in cells):
            section, pending = "procs", None
            continue
        if len(cells) >= 2 and cells[0].startswith("NPU") and "Name" in cells[0]:
            section = "devices"
            continue
        if section == "devices" and cells[0].startswith("Chip"):
            second_id = "Phy-ID" if "Phy-ID" in cells[0] else "Device" if "Device" in cells[0] else ""
            continue
        if section == "devices" and len(cells) >= 2:
            chip = _CHIP_ROW.match(cells[0])
            if pending is not None and chip:
                other = int(chip.group(2)) if chip.group(2) is not None else None
                pairs = _PAIR.findall(cells[2]) if len(cells) > 2 else []
                used, total = (int(pairs[-1][0]), int(pairs[-1][1])) if pairs else (None, None)
                chips.append(
                    replace(
                        pending,
                        chip=int(chip.group(1)),
                        phy=other if second_id == "Phy-ID" else None,
                        device=other if second_id == "Device" else None,
                        bus=cells[1] if _BUS_ID.match(cells[1]) else "",
                        hbm_used=used,
                        hbm_total=total,
                    )
                )
                pending = None
                continue
            m = _NPU_ROW.match(cells[0])
            if m:
                pending = Npu(int(m.group(1)), m.group(2).strip(), known(cells[1]))
        elif section == "procs" and len(cells) >= 3:
            ids = cells[0].split()
            if len(ids) >= 2 and ids[0].isdigit() and ids[1].isdigit() and cells[1].isdigit():
                procs.append(NpuProc(int(ids[0]), int(ids[1]), int(cells[1]), cells[2]))
    return NpuSmi(version, tool_version, tuple(chips), tuple(procs))
