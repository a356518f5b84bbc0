"""The files an ssh config pulls in through ``Include``, checked as the config itself is before
asyncssh reads any of them: each a regular file of bounded size (``named_files.py``), nested at most
``MAX_SSH_INCLUDE_DEPTH`` deep (OpenSSH's own limit; asyncssh has none, and a file that includes
itself ended in a RecursionError), at most ``MAX_SSH_CONFIG_FILES`` in all (a file included twice
on every level doubles the reading per level).

Includes are found as asyncssh finds them (``asyncssh/config.py``: ``_include``): ``~`` expanded,
an absolute pattern globbed from its root, a relative one from ``~/.ssh``, matches that are not
files skipped. Every ``Include`` line counts, inside a ``Host`` or ``Match`` block or not: OpenSSH
reads those files too, whether the block matches or not.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from mscon.console.config import named_files
from mscon.console.config.limits import MAX_SSH_CONFIG_FILES, MAX_SSH_INCLUDE_DEPTH

_DEFAULT_FOLDER = "~/.ssh"  # where asyncssh globs a relative Include (OpenSSH: the user's config too)


def problem(configs: Sequence[str | Path], max_bytes: int) -> str | None:
    """Why the ssh configs ``configs`` (read in this order) may not be read, in one line naming the
    file at fault and the ``Include`` that names it; None when every file is fine. A missing top
    file is left to its reader (ssh skips it); an Include matching nothing reads nothing."""
    seen = 0
    todo: list[tuple[Path, int, str]] = [(Path(c), 0, "") for c in reversed(configs)]
    while todo:
        path, depth, named_by = todo.pop()
        seen += 1
        if seen > MAX_SSH_CONFIG_FILES:
            return f"{path}: more than {MAX_SSH_CONFIG_FILES} ssh config files through Include{named_by}"
        if depth > MAX_SSH_INCLUDE_DEPTH:
            return f"{path}: Include nested more than {MAX_SSH_INCLUDE_DEPTH} deep (a loop?){named_by}"
        why = named_files.problem(path, max_bytes, missing_ok=True)
        if why is not None:
            return why + named_by
        if not path.exists():
            continue
        try:
            text = named_files.read_bounded(path, max_bytes).decode("utf-8", "replace")
        except ValueError as exc:
            return f"{exc}{named_by}"
        found: list[tuple[Path, int, str]] = []
        for number, line in enumerate(text.splitlines(), 1):
            for pattern in _include_patterns(line):
                for included in _matches(pattern):
                    found.append((included, depth + 1, f" (Include in {path} line {number})"))
        todo.extend(reversed(found))  # depth first, in the order asyncssh reads them
    return None


def _include_patterns(line: str) -> list[str]:
    """The patterns of an ``Include`` line, split as asyncssh splits a line ([] for any other)."""
    line = line.strip()
    if not line or line.startswith("#"):
        return []
    try:
        words = shlex.split(line)
    except ValueError:
        return []  # asyncssh refuses that line itself, naming it
    option, _, rest = words[0].partition("=")
    if option.lower() != "include":
        return []
    args = [rest, *words[1:]] if rest else words[1:]
    return [a.removeprefix("=") for a in args if a.removeprefix("=")]


def _matches(pattern: str) -> list[Path]:
    path = Path(pattern).expanduser()
    if path.anchor:
        root, rest = Path(path.anchor), str(Path(*path.parts[1:]))
    else:
        root, rest = Path(_DEFAULT_FOLDER).expanduser(), pattern
    try:
        return sorted(p for p in root.glob(rest) if p.is_file()) if rest not in ("", ".") else []
    except (OSError, ValueError):
        return []
