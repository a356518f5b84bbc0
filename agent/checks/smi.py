"""The device tools' outputs, parsed: shared by the ``devices`` checks and the rank panes' telemetry
(agent/devices.py), so the two never disagree about a format. The tests replay recorded outputs.

- ``nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used,memory.total,utilization.gpu,
  ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits``: one CSV line per GPU
  (fields joined by ", "; an unsupported field reads ``[N/A]``, ``N/A`` or ``[Not Supported]``);
  ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader``: one line per
  compute process (``GPU-<uuid>, 4242, 1234 MiB``), nothing when there is none.
- ``npu-smi info``: the box table of the Ascend driver (Huawei "npu-smi info" reference): a header
  ``| npu-smi 23.0.6   Version: 23.0.6 |``; per chip two rows, ``| NPU  Name | Health | Power(W)
  Temp(C) Hugepages-Usage(page) |`` then ``| Chip [Phy-ID] | Bus-Id | AICore(%) Memory-Usage(MB)
  HBM-Usage(MB) |`` (``| 0  910B3 | OK | 93.6  40  0 / 0 |`` / ``| 0 | 0000:C1:00.0 | 0  0 / 0
  3161 / 65536 |``; chips of one NPU repeat its id); then a process table ``| NPU  Chip | Process id
  | Process name | Process memory(MB) |`` with ``No running processes found in NPU N`` rows when
  idle. Health is ``OK``, ``Warning``, ``Alarm`` or ``Critical``.
"""

from __future__ import annotations

import re

_NOT_A_NUMBER = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions)\]?$", re.I)


def num(s: str) -> int | None:
    s = s.strip()
    if _NOT_A_NUMBER.match(s) or not s:
        return None
    m = re.match(r"^-?\d+", s)
    return int(m.group(0)) if m else None


class Gpu:
    def __init__(self, fields: list) -> None:
        self.index = num(fields[0])
        self.uuid = fields[1].strip()
        self.name = fields[2].strip()
        self.driver = fields[3].strip()
        self.mem_used = num(fields[4])  # MiB
        self.mem_total = num(fields[5])
        self.util = num(fields[6])
        self.ecc = num(fields[7])


GPU_QUERY = (
    "--query-gpu=index,uuid,name,driver_version,memory.used,memory.total,utilization.gpu,"
    "ecc.errors.uncorrected.volatile.total"
)


def parse_gpus(text: str) -> list:
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 8 or num(fields[0]) is None:
            continue
        if len(fields) > 8:  # a name with commas: the fixed fields are at both ends
            fields = fields[:2] + [",".join(fields[2 : len(fields) - 5])] + fields[len(fields) - 5 :]
        gpus.append(Gpu(fields))
    return gpus


def parse_gpu_apps(text: str) -> list:
    """(gpu_uuid, pid, used_mib) per compute process."""
    apps = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3:
            continue
        pid = num(fields[1])
        if pid is None:
            continue
        apps.append((fields[0], pid, num(fields[2])))
    return apps


_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_NPU_ROW = re.compile(r"^(\d+)\s+(\S.*)$")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")


class Npu:
    def __init__(self, npu: int, name: str, health: str) -> None:
        self.npu = npu
        self.name = name
        self.health = health
        self.chip = 0
        self.phy: int | None = None  # Phy-ID, where npu-smi shows one (several chips per NPU)
        self.bus = ""
        self.hbm_used: int | None = None
        self.hbm_total: int | None = None

    @property
    def label(self) -> str:
        return "NPU %d chip %d" % (self.npu, self.chip)

    @property
    def hccn_id(self) -> int:
        """The id hccn_tool -i takes: the NPU id (the chip's Phy-ID where an NPU has several)."""
        return self.phy if self.phy is not None else self.npu


def parse_npu_smi(text: str) -> tuple:
    """(version, [Npu per chip, in order: the logical device ids], [(npu, chip, pid, name)])."""
    version = ""
    chips: list = []
    procs: list = []
    section = ""
    pending: Npu | None = None
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("|"):
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if not version:
            m = re.search(r"Version:\s*(\S+)", s)
            if m:
                version = m.group(1)
                continue
        if len(cells) >= 2 and cells[0].startswith("NPU") and "Name" in cells[0]:
            section = "devices"
            continue
        if cells[0].startswith("NPU") and any(c.startswith("Process id") for c in cells):
            section = "procs"
            continue
        if section == "devices" and len(cells) >= 2:
            if _BUS_ID.match(cells[1]):
                if pending is not None:
                    ids = cells[0].split()
                    pending.chip = int(ids[0]) if ids and ids[0].isdigit() else 0
                    if len(ids) > 1 and ids[1].isdigit():
                        pending.phy = int(ids[1])
                    pending.bus = cells[1]
                    pairs = _PAIR.findall(cells[2]) if len(cells) > 2 else []
                    if pairs:
                        pending.hbm_used, pending.hbm_total = int(pairs[-1][0]), int(pairs[-1][1])
                    chips.append(pending)
                    pending = None
                continue
            m = _NPU_ROW.match(cells[0])
            if m:
                pending = Npu(int(m.group(1)), m.group(2).strip(), cells[1])
        elif section == "procs" and len(cells) >= 4:
            ids = cells[0].split()
            if len(ids) >= 2 and ids[0].isdigit() and ids[1].isdigit() and cells[1].isdigit():
                procs.append((int(ids[0]), int(ids[1]), int(cells[1]), cells[2]))
    return version, chips, procs
