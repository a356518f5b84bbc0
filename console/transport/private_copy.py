"""What the console keeps of a run on the operator's machine: the copies of what the nodes hold
(logs, checkpoints, the journal) and what it writes itself into the run folder (the recording,
``summary.json``, ``console.err``, the detach record): every folder mscon makes or fills for them
0700 and every file 0600, whatever the console's umask, and nothing written through a link. The
node side of the same rule is ``agent/layout.py``."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from mscon.agent import layout

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def private_folder(path: Path | str) -> Path:
    """``path`` made (with each missing level above it) or kept, and made 0700: a run's folder
    that the recording made earlier under another umask is tightened too. Never through a link:
    a link at ``path`` itself is an error (OSError)."""
    layout.private_dirs(str(path))
    _tighten(Path(path))
    return Path(path)


def private_folders(logs_root: str | None, dest: Path) -> None:
    """A fetch's destination and the run folder it lies in (made by the run's recording, perhaps
    under another umask), 0700."""
    if logs_root is not None:
        private_folder(logs_root)
    private_folder(dest)


def private_subfolder(path: Path) -> None:
    """One level under a folder already made private: made 0700, or kept and made 0700; a link
    there is removed first (never followed into another folder)."""
    if path.is_symlink():
        path.unlink()
    try:
        os.mkdir(path, layout.PRIVATE_DIR)
    except FileExistsError:
        pass
    _tighten(path)


def private_file(path: Path) -> int:
    """A descriptor of ``path`` opened for writing, truncated, 0600 whatever the umask; a link
    there is removed first and never written through."""
    if path.is_symlink():
        path.unlink()
    return layout.private_fd(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW)


def private_text(path: Path, text: str, *, append: bool = False) -> None:
    """``text`` written to ``path`` as ``private_write`` writes."""
    private_write(path, lambda f: f.write(text), append=append)


def private_write(path: Path, write: Callable[[TextIO], object], *, append: bool = False) -> None:
    """What ``write`` writes to the file it is given, written to (or appended to) ``path``, in
    place, 0600 whatever the umask; missing folders above it are made 0700, those there left as
    they are. What is there is written through
    (``--json`` may name a pipe or ``/dev/stdout``), but only a regular file of this user's is
    made 0600: never a terminal or a pipe."""
    layout.private_dirs(str(path.parent))
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, layout.PRIVATE_FILE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
            if stat.S_IMODE(st.st_mode) != layout.PRIVATE_FILE:
                os.fchmod(fd, layout.PRIVATE_FILE)  # made earlier, under another umask
        write(f)


def made_private(path: Path) -> None:
    """A file another writer made (an SFTP download) set to 0600, never through a link."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != layout.PRIVATE_FILE:
            os.fchmod(fd, layout.PRIVATE_FILE)
    finally:
        os.close(fd)


def _tighten(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != layout.PRIVATE_DIR:
            os.fchmod(fd, layout.PRIVATE_DIR)
    finally:
        os.close(fd)
