"""The node's disk use for MindSpore's compiled graphs: each run keeps its ranks' graphs in its own
0700 folder (``layout.compile_cache_folder``; one sub-folder per graph key, written by the ranks:
mscon_resume/compile_cache.py), so that a restarted attempt or a spare loads them instead of
compiling again. What bounds it:

- a run's folder holds at most ``MAX_BYTES``: checked as each attempt starts, the key folders
  written longest ago go first (never the newest: the last attempt's graphs are the next one's);
- a run that is over keeps none: ``retention.prune_at_start`` removes the folders of the node's
  ended runs (its graphs are no use to another run: a run's key names its own folder).

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
from dataclasses import dataclass

from . import layout

MAX_BYTES = 4 << 30  # per run and node: ResNet-50's graphs take tens of MB a rank; 64 ranks fit


@dataclass(frozen=True)
class Entry:
    """One key folder of a run's cache."""

    name: str
    bytes: int
    used: float  # the newest modification time inside it (epoch seconds)


def prepare(run_dir: str) -> str:
    """The run's cache folder, made 0700 (each level), before any rank writes to it."""
    return layout.private_dirs(layout.compile_cache_folder(run_dir))


def entries(folder: str) -> list:
    """The key folders of a cache folder (links and files are no key folder: left out, never
    followed), each with its size and when it was last written."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        path = posixpath.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not layout.plain(name) or not stat.S_ISDIR(st.st_mode):
            continue
        size, used = 0, st.st_mtime
        for here, dirs, files in os.walk(path):
            for n in dirs + files:
                try:
                    sub = os.lstat(posixpath.join(here, n))
                except OSError:
                    continue
                used = max(used, sub.st_mtime)
                if stat.S_ISREG(sub.st_mode):
                    size += sub.st_size
        out.append(Entry(name, size, used))
    return out


def over_bound(found: list, max_bytes: int) -> list:
    """The entries to remove so that the rest fit in ``max_bytes``: the least recently written
    first, never the most recent one (whatever its size: the graphs the next attempt loads)."""
    newest_first = sorted(found, key=lambda e: (e.used, e.name), reverse=True)
    total = sum(e.bytes for e in found)
    out = []
    for e in reversed(newest_first[1:]):
        if total <= max_bytes:
            break
        out.append(e)
        total -= e.bytes
    return out


def bound(run_dir: str, max_bytes: int = MAX_BYTES) -> list:
    """Hold the run's cache folder to ``max_bytes``: the entries removed (``over_bound``)."""
    folder = layout.compile_cache_folder(run_dir)
    gone = over_bound(entries(folder), max_bytes)
    for e in gone:
        shutil.rmtree(posixpath.join(folder, e.name), ignore_errors=True)
    return gone


def drop(run_dir: str) -> int:
    """Remove a run's cache folder (a run that is over): the bytes it held."""
    folder = layout.compile_cache_folder(run_dir)
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return 0
    except OSError:
        return 0
    size = sum(e.bytes for e in entries(folder))
    shutil.rmtree(folder, ignore_errors=True)
    return size


def describe(size: int) -> str:
    """Bytes in words for the agent's notes."""
    return "%.1f MB" % (size / 1e6)
