"""What of the job's workdir goes to the nodes, and which workdirs are refused before any packing.

The files are those a walk finds, less mscon's defaults (VCS data, virtual environments, caches,
its own logs), the inventory's ``job.exclude`` and the workdir's ``.gitignore`` files (``ignore.py``);
links are never followed. A workdir that is ``/``, a home folder (or a folder above one), or whose
files add up to more than ``job.max_workdir_gib`` is refused with one line (:class:`WorkdirRefused`).
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from mscon.agent.layout import LOGS_DIR
from mscon.console.config.limits import MAX_KEY_FILE_BYTES
from mscon.console.transport import ignore

# Never synced: VCS data, virtual environments, caches, and mscon's own outputs.
DEFAULT_EXCLUDES = (
    ".git",
    ".hg",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    LOGS_DIR,
    "*.egg-info",
    "node_modules",
)
GIB = 2**30


class WorkdirRefused(Exception):
    """The workdir is not packed; ``str()`` is one line saying why and what to do."""


@dataclass(frozen=True, slots=True)
class WorkdirFile:
    arc: str  # its name in the archive: relative to the workdir, "/"-separated
    path: str
    size: int


def homes() -> set[Path]:
    """The console user's home folders ($HOME and the passwd entry's), resolved. Not every
    user's (``getpwall`` walks a whole LDAP directory at some sites); ``/home`` is refused anyway,
    as a folder above one."""
    found = {Path.home()}
    try:
        found.add(Path(pwd.getpwuid(os.getuid()).pw_dir))
    except (KeyError, OSError):
        pass
    out = set()
    for home in found:
        try:
            out.add(home.resolve())
        except (OSError, RuntimeError):
            continue
    return out


def check_location(root: Path) -> None:
    """Refuse ``/``, a home folder or a folder that holds one: everything in it would go to every node."""
    root = root.resolve()
    if root == Path(root.anchor):
        raise WorkdirRefused(
            f"job.workdir is {root}: the whole file system would be copied to every node; "
            "set job.workdir (or --workdir) to the folder that holds the training script"
        )
    for home in homes():
        if root == home or home.is_relative_to(root):
            what = "a home folder" if root == home else f"a folder that holds the home folder {home}"
            raise WorkdirRefused(
                f"job.workdir is {root}, {what}: all of it would be copied to every node; "
                "set job.workdir (or --workdir) to the folder that holds the training script"
            )


def workdir_files(
    root: Path, extra_excludes: tuple[str, ...] = (), max_bytes: int | None = None
) -> list[WorkdirFile]:
    """The files to sync, sorted by their archive name; WorkdirRefused as soon as they add up to
    more than ``max_bytes``."""
    base_rules = ignore.parse(list(DEFAULT_EXCLUDES + extra_excludes))
    found: list[WorkdirFile] = []
    total = 0

    def walk(folder: Path, rel: str, rules: list[ignore.Rule]) -> None:
        nonlocal total
        _check_gitignore(folder)
        rules = rules + ignore.read_rules(folder, rel)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            arc = f"{rel}/{e.name}" if rel else e.name
            try:
                is_dir = e.is_dir(follow_symlinks=False)
                is_file = e.is_file(follow_symlinks=False)
            except OSError:
                continue
            if not (is_dir or is_file) or ignore.ignored(rules, arc, is_dir):
                continue  # links could point outside the workdir: never followed
            if is_dir:
                walk(Path(e.path), arc, rules)
                continue
            try:
                size = e.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            total += size
            if max_bytes is not None and total > max_bytes:
                raise WorkdirRefused(
                    f"job.workdir {root} holds more than {max_bytes / GIB:g} GiB to copy to every node "
                    f"(at {arc}); keep data sets and outputs out of it with job.exclude or a "
                    ".gitignore, or raise job.max_workdir_gib"
                )
            found.append(WorkdirFile(arc, e.path, size))

    walk(root, "", base_rules)
    found.sort(key=lambda f: f.arc)
    return found


def _check_gitignore(folder: Path) -> None:
    """A .gitignore is read whole: one larger than any list of patterns is refused, not read
    (one that is not a regular file is skipped by ``ignore.read_rules``)."""
    path = folder / ignore.GITIGNORE
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_size > MAX_KEY_FILE_BYTES:
        raise WorkdirRefused(
            f"{path} is too large: {st.st_size} bytes (at most {MAX_KEY_FILE_BYTES}); "
            "a .gitignore holds patterns, not data"
        )


def check_workdir(root: Path, extra_excludes: tuple[str, ...] = (), max_gib: float | None = None) -> None:
    """Everything that refuses a workdir before packing: where it is, then what it would send."""
    check_location(root)
    workdir_files(root, extra_excludes, None if max_gib is None else int(max_gib * GIB))
