"""What mscon keeps on a node, as its modes say: every folder it makes under the node user's
``~/.cache/mscon`` 0700, every file it uploads or writes 0600 (issue 33)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mscon.agent import layout

# What the job itself writes keeps its own modes, inside mscon's 0700 folders: its checkpoints
# and, on nodes that sync it, the unpacked workdir (the folders themselves are mscon's).
JOBS_OWN = (layout.CHECKPOINT_DIR, layout.WORK_DIR)
FOLDER_MODE = 0o700
FILE_MODE = 0o600


def loose(root: Path) -> list[str]:
    """``"<mode> <path>"`` for each folder under ``root`` (``root`` too) that is not 0700 and each
    file or socket that is not 0600; links are not followed, the job's own files are left out."""
    found = []
    for folder, subdirs, files in os.walk(root):
        here = Path(folder)
        parts = here.relative_to(root).parts
        jobs = len(parts) >= 4 and parts[0] == layout.RUNS_DIR and parts[3] in JOBS_OWN
        st = os.lstat(here)
        if not (jobs and len(parts) > 4) and stat.S_IMODE(st.st_mode) != FOLDER_MODE:
            found.append(f"{stat.S_IMODE(st.st_mode):04o} {here}/")
        if jobs:
            continue  # runs/<id>/<node>/checkpoints/...: the job's
        for name in files + [d for d in subdirs if os.path.islink(here / d)]:
            st = os.lstat(here / name)
            if stat.S_ISLNK(st.st_mode):
                continue
            if stat.S_IMODE(st.st_mode) != FILE_MODE:
                found.append(f"{stat.S_IMODE(st.st_mode):04o} {here / name}")
    return sorted(found)


def not_private(root: Path) -> list[str]:
    """``loose`` for a copy on the console: ``"<mode> <path>"`` of each folder not 0700 and each
    file not 0600 under ``root`` (``root`` too), the job's own files included."""
    found = []
    for path in [root, *root.rglob("*")]:
        want = FOLDER_MODE if path.is_dir() else FILE_MODE
        got = stat.S_IMODE(path.lstat().st_mode)
        if got != want:
            found.append(f"{got:04o} {path}")
    return found


def listing(root: Path) -> str:
    """``ls -l``-like lines of everything under ``root``: for failure messages and reports."""
    lines = []
    for folder, subdirs, files in os.walk(root):
        for name in [""] + sorted(files):
            path = Path(folder) / name if name else Path(folder)
            st = os.lstat(path)
            lines.append(f"{stat.filemode(st.st_mode)} {path}")
        subdirs.sort()
    return "\n".join(lines)
