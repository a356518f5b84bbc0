"""The job's workdir and script as the command line gives them (``mscon run/up/check`` and ``init``)."""

from __future__ import annotations

from pathlib import Path


def workdir_of(given: Path | None) -> Path | None:
    """``--workdir`` or the current folder, resolved; None if it is no directory."""
    workdir = (given if given is not None else Path.cwd()).resolve()
    return workdir if workdir.is_dir() else None


def script_in_workdir(given: str, workdir: Path) -> str | None:
    """The script's path relative to the workdir, or None if it is not a file inside it."""
    for candidate in (workdir / given, Path(given)):
        path = candidate.resolve()
        if path.is_file():
            try:
                return path.relative_to(workdir).as_posix()
            except ValueError:
                continue
    return None
