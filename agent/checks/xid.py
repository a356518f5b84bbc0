"""The NVIDIA driver's Xid reports in the kernel log, parsed: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=...,
name=..., GPU has fallen off the bus.`` Pure: text in, frozen dataclasses out; reading the log is the
caller's job (checks/gpu.py). tests/agent/data/devices/kernel-log/ holds recorded real logs.

As they really print (see the fixtures' index entries):
- the line's prefix depends on the reader: ``[ 8659.726062]`` (dmesg), ``[Fri Aug 30 11:43:09 2024]``
  (dmesg -T), ``May 15 08:57:36 host kernel:`` (journalctl, syslog), both (``... kernel: [ 8659.7]``),
  ISO times (journalctl -o short-iso), a bare ``kernel:``, or nothing (/dev/kmsg readers);
- the device is ``PCI:DDDD:BB:DD`` (a domain other than 0000 on Grace systems); older drivers leave
  ``PCI:`` out, some print the function (``.0``);
- ``pid=1234, name=python,`` (a process), ``pid='<unknown>', name=<unknown>,`` (none known),
  ``pid=0, name=,``, or neither (``79, GPU has fallen off the bus.``, ``62, 12b2(1fa0) ...``);
- a pager may cut the line (``Graphi>``): the code and device are still there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?\):\s*(\d+)"
    r"(?:,\s*(.*))?$"
)
_PID = re.compile(r"^pid='?([^,']*)'?,\s*")
_NAME = re.compile(r"^name=([^,]*),?\s*")
# The reader's time, most specific first; the first that matches the line's prefix wins.
_TIMES = (
    re.compile(r"^([A-Z][a-z]{2}\s+\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?)\s"),  # journalctl, syslog
    re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[^\s]*)\s"),  # ISO (short-iso, rsyslog)
    re.compile(r"^\[\s*([^\]]+?)\s*\]"),  # dmesg: seconds since boot, or -T's date
)


@dataclass(frozen=True)
class Xid:
    bus: str  # as the kernel printed it, without "PCI:": "0000:3b:00"
    code: int
    pid: int | None  # None where the driver names no process (<unknown>, 0, or nothing)
    process: str | None
    message: str  # the text after the process (or after the code), possibly cut by a pager
    timestamp: str  # the reader's time as printed ("" where the line has none)


def parse_xids(text: str) -> tuple:
    """Every Xid report of a kernel log, in order; other lines are skipped."""
    out = []
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            out.append(_xid(line[: m.start()], m))
    return tuple(out)


def _xid(prefix: str, m: re.Match) -> Xid:
    rest = (m.group(3) or "").strip()
    pid: int | None = None
    process: str | None = None
    p = _PID.match(rest)
    if p:
        rest = rest[p.end() :]
        pid = int(p.group(1)) if p.group(1).isdigit() and int(p.group(1)) > 0 else None
        n = _NAME.match(rest)
        if n:
            rest = rest[n.end() :]
            name = n.group(1).strip()
            process = name if name and name != "<unknown>" else None
    return Xid(m.group(1), int(m.group(2)), pid, process, rest.strip(), _timestamp(prefix))


def _timestamp(prefix: str) -> str:
    s = prefix.strip()
    for pattern in _TIMES:
        t = pattern.match(s)
        if t:
            return t.group(1)
    return ""
