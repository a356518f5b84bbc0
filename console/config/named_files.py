"""Files an inventory (or a flag) names and the console reads: SSH keys, known-hosts files, ssh
configs, hostfiles. Each is checked to be a regular file of bounded size before anything opens it:
a character device such as /dev/zero is read forever, a FIFO blocks its reader, a folder or a
huge file is no key. The check follows links, as the reader will."""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind(mode: int) -> str:
    """What a file of ``mode`` is, in words, for a refusal of anything but a regular file."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def _empty_device(path: str | Path, mode: int) -> bool:
    """/dev/null: a device, but one that reads empty at once (``UserKnownHostsFile /dev/null``
    is how ssh configs say "no known hosts"), so it is read as an empty file."""
    return stat.S_ISCHR(mode) and os.path.realpath(path) == os.devnull


def problem(path: str | Path, max_bytes: int, missing_ok: bool = False) -> str | None:
    """Why ``path`` may not be read, in words that name it (None: a regular file of at most
    ``max_bytes``, or missing where ``missing_ok``: its reader says so in its own words)."""
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        return None if missing_ok else f"cannot read {path}: {exc.strerror}"
    except (OSError, ValueError) as exc:
        return f"cannot read {path}: {(exc.strerror if isinstance(exc, OSError) else None) or exc}"
    if _empty_device(path, st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file ({kind(st.st_mode)})"
    if st.st_size > max_bytes:
        return f"{path} is too large: {st.st_size} bytes (at most {max_bytes})"
    return None


def read_bounded(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; ValueError (its one-line reason) for
    anything else. Opened without blocking and checked again once open: a path swapped for a FIFO
    or a device after :func:`problem` still cannot hold the reader."""
    why = problem(path, max_bytes)
    if why is not None:
        raise ValueError(why)
    if _empty_device(path, os.stat(path).st_mode):
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not a regular file ({kind(mode)})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"{path} is too large: more than {max_bytes} bytes")
    return data
