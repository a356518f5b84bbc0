"""Paths that must stay inside a root: node names, run ids and file names a node sends back.

Every join of a value that did not come from mscon itself (an inventory's node name, a run id
given on the command line, a file name listed by a node) goes through :func:`within` (local
paths) or :func:`remote_within` (POSIX paths on a node). Both check each component lexically
and raise :class:`UnsafePath` (a ``ValueError``) for anything that could leave the root: ``..``,
an absolute part, an empty name, NUL or another control character. Symbolic links are not
resolved here; code that walks a tree a node wrote (fetching logs) must not follow them.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

__all__ = ["UnsafePath", "is_plain_name", "label", "remote_within", "within"]


class UnsafePath(ValueError):
    """A path (or a name used as one) that would leave its root or is not a plain name."""


def _problem(name: str) -> str | None:
    """Why ``name`` is not a plain file name (one path component), or None when it is."""
    if not isinstance(name, str):
        return f"expected a string, got {type(name).__name__}"
    if name == "":
        return "an empty name"
    if name in (".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name:
        return "contains '/'"
    for ch in name:
        if ch == "\0":
            return "contains NUL"
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            return f"contains the control character {ch!r}"
    return None


def is_plain_name(name: str) -> bool:
    """True for one path component: not empty, not ``.``/``..``, no ``/``, NUL or control character."""
    return _problem(name) is None


def label(name: str, what: str = "name") -> str:
    """``name`` itself when it is a plain name (see :func:`is_plain_name`), else :class:`UnsafePath`."""
    problem = _problem(name)
    if problem is not None:
        raise UnsafePath(f"{what} {name!r} cannot be used as a file name: {problem}")
    return name


def _components(root: str, parts: tuple[str, ...]) -> list[str]:
    if not isinstance(root, str) or root == "":
        raise UnsafePath("empty root path")
    if "\0" in root:
        raise UnsafePath(f"root path {root!r} contains NUL")
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str) or part == "":
            raise UnsafePath(f"empty path part under {root!r}")
        if part.startswith("/"):
            raise UnsafePath(f"absolute path {part!r} where a name under {root!r} was expected")
        for comp in part.split("/"):
            problem = _problem(comp)
            if problem is not None:
                raise UnsafePath(f"{part!r} would not stay inside {root!r}: {problem}")
            out.append(comp)
    return out


def within(root: str | Path, *parts: str) -> Path:
    """``root / part / ...``, refusing any part that could leave ``root`` (see module doc).

    A part may hold several components (``"attempt_0/r0.log"``); each one must be a plain name.
    """
    base = str(root)
    comps = _components(base, parts)
    result = Path(base).joinpath(*comps)
    # Lexically inside by construction; checked once more so a future change cannot break it.
    if comps and Path(base) not in result.parents:
        raise UnsafePath(f"{result} is not inside {base}")
    return result


def remote_within(root: str, *parts: str) -> str:
    """The POSIX path ``root/part/...`` on a node, with the same checks as :func:`within`."""
    comps = _components(root, parts)
    result = posixpath.join(root, *comps)
    rel = posixpath.relpath(posixpath.normpath(result), posixpath.normpath(root))
    if comps and (rel == "." or rel == ".." or rel.startswith("../")):
        raise UnsafePath(f"{result} is not inside {root}")
    return result
