"""A second local user for the tests of what another user on a node can see or plant."""

from __future__ import annotations

import pwd
import subprocess

INTRUDER = "mscon-intruder"


def intruder_uid() -> int | None:
    """The uid of a second local user (made once with useradd; ``nobody`` where users cannot be
    added); None when neither exists."""
    try:
        return pwd.getpwnam(INTRUDER).pw_uid
    except KeyError:
        pass
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", INTRUDER], capture_output=True, check=False
    )
    for name in (INTRUDER,) if made.returncode == 0 else ("nobody",):
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
    return None


def run_as(uid: int, *argv: str, data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``argv`` run as ``uid`` (its own group), ``data`` on its stdin."""
    return subprocess.run(
        list(argv), user=uid, group=uid, input=data, capture_output=True, timeout=30, check=False
    )
