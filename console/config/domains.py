"""The value domains of an inventory's fields: names, login names, hosts, addresses, env names and
interpreters. Shared with the Slurm reader, which checks the allocation's host names the same way."""

from __future__ import annotations

import ipaddress
import re

from mscon.console.config.limits import MAX_NAME

LABEL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*", re.ASCII)
_ALIAS_RE = LABEL_RE  # ssh-config aliases, hostnames and IPv4 literals all fit it
DOTTED_NUMBERS = re.compile(r"[0-9.]+", re.ASCII)
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*\$?", re.ASCII)
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
PY_ABS = re.compile(r"/[A-Za-z0-9._+@=,~/-]*", re.ASCII)
PY_BARE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*", re.ASCII)

HOST_WHAT = (
    "a hostname, IP address or ssh-config alias "
    "(letters, digits, '.', '_', '-'; not starting with '-' or '.')"
)
ADDRESS_WHAT = "an IP address or hostname"
NAME_WHAT = f"a name of letters, digits, '.', '_', '-' (not starting with '-' or '.', at most {MAX_NAME})"


def ip_literal(value: str) -> bool:
    if "%" in value:  # scoped IPv6 addresses name an interface of one machine only
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def host_problem(value: str) -> str | None:
    """None: not in the domain at all; "": fine; else what is wrong with it."""
    if ":" in value:
        return "" if ip_literal(value) else "not a valid IPv6 address (no brackets, no %zone)"
    if not _ALIAS_RE.fullmatch(value):
        return None
    if DOTTED_NUMBERS.fullmatch(value) and not ip_literal(value):
        return "not a valid IPv4 address"
    return ""


def is_hostname(value: str) -> bool:
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    return len(value) <= 253 and all(_HOST_LABEL.fullmatch(lab) for lab in labels)
