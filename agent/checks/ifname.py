"""``ifname.<VAR>``: each NCCL/HCCL/GLOO ``*_SOCKET_IFNAME`` that is set selects an interface of
this node that is up (``ifname`` n/a when none is set)."""

from __future__ import annotations

import os

from .params import Params
from .results import FAIL, NA, OK, WARN, result

IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")

_SYS_NET = "/sys/class/net"
_IFF_UP = 0x1


def interfaces() -> dict:
    """name -> True when up (IFF_UP set and operstate not down), from /sys/class/net."""
    out = {}
    try:
        names = sorted(os.listdir(_SYS_NET))
    except OSError:
        return out
    for name in names:
        base = os.path.join(_SYS_NET, name)
        state = _read(os.path.join(base, "operstate")).lower()
        flags = _read(os.path.join(base, "flags"))
        try:
            admin_up = bool(int(flags, 16) & _IFF_UP) if flags else state == "up"
        except ValueError:
            admin_up = state == "up"
        out[name] = admin_up and state in ("up", "unknown")
    return out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def match_ifname(spec: str, names: list, prefix_match: bool = True) -> tuple:
    """The interfaces an NCCL-style *_SOCKET_IFNAME selects, and the entries that match nothing.

    NCCL: a comma list of prefixes (``eth``: eth0, eth1...), ``=`` before the list for exact
    names, ``^`` before it to exclude instead (``^docker``, ``^=docker0``)."""
    s = spec.strip()
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    exact = s.startswith("=") or not prefix_match
    if s.startswith("="):
        s = s[1:]
    entries = [e.strip() for e in s.split(",") if e.strip()]

    def hits(entry: str) -> list:
        return [n for n in names if (n == entry if exact else n.startswith(entry))]

    unmatched = [e for e in entries if not hits(e)]
    matched = {n for e in entries for n in hits(e)}
    if exclude:
        return [n for n in names if n not in matched and n != "lo"], unmatched, True
    return [n for n in names if n in matched], unmatched, False


def check_ifname(p: Params) -> list:
    out = []
    ifs = interfaces()
    names = sorted(ifs)
    listing = ", ".join("%s (%s)" % (n, "up" if ifs[n] else "down") for n in names) or "none"
    relevant = {"NCCL_SOCKET_IFNAME": ("GPU",), "HCCL_SOCKET_IFNAME": ("Ascend",)}
    for var in IFNAME_VARS:
        spec = p.env_value(var)
        if spec is None:
            continue
        name = "ifname." + var
        bad = FAIL if p.target in relevant.get(var, ("GPU", "Ascend", "CPU")) else WARN
        if not spec.strip():
            out.append(result(name, WARN, "%s is empty" % var, "unset %s or name an interface" % var))
            continue
        # Gloo takes exact names; NCCL and HCCL prefixes with the =/^ forms.
        selected, unmatched, exclude = match_ifname(spec, names, prefix_match=var != "GLOO_SOCKET_IFNAME")
        up = [n for n in selected if ifs.get(n)]
        value = "%s=%s" % (var, spec)
        remedy = "set %s to an interface of this node that is up" % var
        if not up:
            why = (
                "excludes every interface that is up"
                + (" but lo (no way to other nodes)" if ifs.get("lo") else "")
                if exclude
                else (
                    "no interface %s" % ", ".join(unmatched) if unmatched else "%s down" % ", ".join(selected)
                )
            )
            out.append(result(name, bad, value, remedy, "%s; this node has: %s" % (why, listing)))
        elif unmatched and not exclude:
            out.append(
                result(
                    name,
                    WARN,
                    value,
                    remedy,
                    "no interface %s (using %s); this node has: %s"
                    % (", ".join(unmatched), ", ".join(up), listing),
                )
            )
        else:
            out.append(result(name, OK, value, detail="selects %s" % ", ".join(up)))
    if not out:
        out.append(
            result(
                "ifname",
                NA,
                "none set",
                detail="the libraries choose the interface; this node has: " + listing,
            )
        )
    return out
