"""hccn_tool's answers about an NPU's network port, parsed (Ascend driver, /usr/local/Ascend/driver/
tools). Pure: text in, values out; running the tool is the caller's job (checks/npu.py).
tests/agent/data/devices/hccn_tool/ holds recorded outputs, and the formats below are those of
hccn_tool's own print statements:

- ``-i N -link -g``: ``link status: UP`` or ``DOWN``; UB-connected PCIe cards print ``link status :
  UP`` (a space before the colon) and also ``PARTIAL LINK`` or ``NA``. ``-vnic -g`` prints ``vnic link
  status: ...``, which is another port and is not read here.
- ``-i N -net_health -g``: ``net health status: W``, W one of Success, Socket fail, Receive timeout,
  Unreachable, Time exceeded, Fault, Init, Thread error, Detect ip set, Unknown.
- ``-i N -ip -g``: ``ipaddr:A`` and ``netmask:M`` lines; ``Get ipconf failed, because no ip was preset
  there!`` where the port has no address.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINK = re.compile(r"^\s*link status\s*:\s*(\S.*?)\s*$", re.I | re.M)
_HEALTH = re.compile(r"^\s*net health status\s*:\s*(\S.*?)\s*$", re.I | re.M)
_IPADDR = re.compile(r"^\s*ipaddr\s*:\s*(\S+)", re.I | re.M)
_NETMASK = re.compile(r"^\s*netmask\s*:\s*(\S+)", re.I | re.M)
NET_HEALTH_GOOD = "Success"


@dataclass(frozen=True)
class HccnIp:
    address: str  # as printed (documentation copies mask digits: "10.xx.xx.10")
    netmask: str  # "" where the answer has no netmask line


def parse_hccn_link(text: str) -> str | None:
    """The port's link status as printed (UP, DOWN, PARTIAL LINK, NA), None if the answer has none."""
    m = _LINK.search(text)
    return m.group(1) if m else None


def parse_hccn_net_health(text: str) -> str | None:
    """The net health word(s) as printed (Success, Fault, Init, ...), None if the answer has none."""
    m = _HEALTH.search(text)
    return m.group(1) if m else None


def parse_hccn_ip(text: str) -> HccnIp | None:
    """The port's address, None where hccn_tool says none is set (or prints no ipaddr line)."""
    m = _IPADDR.search(text)
    if not m:
        return None
    mask = _NETMASK.search(text)
    return HccnIp(m.group(1), mask.group(1) if mask else "")
