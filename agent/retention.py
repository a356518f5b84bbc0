"""Which old run folders go: keep the newest N runs of a node, never one that is running or detached;
and the node memory (/dev/shm) a run that is over still holds.

Run on the nodes (the agent prunes its node's runs as a run starts, and ``mscon prune`` asks it to)
and by the console for its own fetched ``./mscon-runs``, so the choice is one pure function,
:func:`choose`, over :class:`Candidate` values; the node's folders are read by :func:`node_runs`.

A folder is removed by renaming it out of the way first (``.pruning-*`` under the runs root), then
deleting it: a half-deleted run never looks like a run to ``mscon ls``, and an agent killed while
deleting leaves a leftover the next prune removes.

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import sys
import time
from dataclasses import dataclass

from . import compile_cache
from .journal import RunStatus, agent_alive, read_state
from .layout import own_shm_snapshot_folders, plain, runs_root

KEEP_RUNS = 20  # runs of each node kept by default (inventory retention.keep_runs)
TRASH_PREFIX = ".pruning-"  # a folder being deleted, renamed out of the runs root's listing
# A folder with no state.json yet may be a run being created this very moment (state.json comes
# once its ranks start); it counts as finished only once it has been left alone this long.
_NO_STATE_GRACE_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True)
class Candidate:
    """A run folder that may go."""

    key: str  # what the caller names it by (a run id)
    when: float  # when the run started (epoch seconds)
    protected: bool  # running or detached: never removed
    path: str


def choose(
    candidates: list[Candidate], keep: int, older_than_s: float | None = None, now: float | None = None
) -> list[Candidate]:
    """The candidates to remove: all but the ``keep`` newest, and of those only the ones that
    started more than ``older_than_s`` seconds ago (when given); never a protected one. The newest
    ``keep`` are counted over every candidate, protected ones included."""
    now = time.time() if now is None else now
    newest_first = sorted(candidates, key=lambda c: (c.when, c.key), reverse=True)
    out = []
    for c in newest_first[max(0, keep) :]:
        if c.protected:
            continue
        if older_than_s is not None and now - c.when < older_than_s:
            continue
        out.append(c)
    return out


def folder_bytes(path: str) -> int:
    """The bytes of the regular files under ``path``; links are counted as links, never followed."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames + dirnames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _mtime(path: str) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def node_runs(root: str, node: str, now: float | None = None) -> list[Candidate]:
    """A :class:`Candidate` (key: the run id) for each run folder of ``node`` under the runs root."""
    now = time.time() if now is None else now
    try:
        run_ids = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for run_id in run_ids:
        if not plain(run_id) or run_id.startswith(TRASH_PREFIX) or not plain(node):
            continue
        path = posixpath.join(root, run_id, node)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue  # not a folder, or a link: never followed, never removed
        except OSError:
            continue
        state = read_state(path)
        if state is None:
            when = _mtime(path)
            protected = now - when < _NO_STATE_GRACE_S
        else:
            started = state.get("started")
            number = isinstance(started, (int, float)) and not isinstance(started, bool)
            when = float(started) if number else _mtime(path)
            running = state.get("status", RunStatus.RUNNING) == RunStatus.RUNNING
            protected = running or bool(state.get("detached"))
        out.append(Candidate(run_id, when, protected, path))
    return out


def remove(root: str, path: str) -> None:
    """Delete a run folder under ``root``: renamed out of sight first, then deleted; its run id's
    folder goes too once no node's folder is left in it. OSError if it cannot be moved."""
    trash = posixpath.join(root, "%s%s" % (TRASH_PREFIX, os.urandom(6).hex()))
    for folder in own_shm_snapshot_folders(path):  # keyed by the run's path
        shutil.rmtree(folder, ignore_errors=True)
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rmdir(posixpath.dirname(path))  # runs/<run id>/: only when empty
    except OSError:
        pass


def _sweep_trash(root: str) -> None:
    """Leftovers of a prune that was killed while deleting."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if name.startswith(TRASH_PREFIX) and plain(name):
            shutil.rmtree(posixpath.join(root, name), ignore_errors=True)


def prune(
    root: str,
    node: str,
    keep: int,
    older_than_days: float | None = None,
    dry_run: bool = False,
    skip: tuple = (),
    now: float | None = None,
) -> list[tuple[str, int, str]]:
    """Remove (with ``dry_run``: only name) the node's runs :func:`choose` picks, never one in
    ``skip`` (run ids). A list of ``(run id, bytes, error)``; error is "" where it went."""
    now = time.time() if now is None else now
    older = None if older_than_days is None else float(older_than_days) * DAY_S
    runs = [c for c in node_runs(root, node, now) if c.key not in skip]
    done = []
    for c in choose(runs, keep, older, now):
        size = folder_bytes(c.path)
        error = ""
        if not dry_run:
            try:
                remove(root, c.path)
            except OSError as exc:
                error = exc.strerror or str(exc)
        done.append((c.key, size, error))
    if not dry_run:
        _sweep_trash(root)
    return done


def _over(path: str) -> bool:
    """The run whose node folder is ``path`` is over: ended, or lost (its agent was killed before
    it could say so). A running or detached run is not, nor one with no state yet."""
    state = read_state(path)
    if state is None or (state.get("detached") and state.get("status") == RunStatus.RUNNING):
        return False
    return not (state.get("status", RunStatus.RUNNING) == RunStatus.RUNNING and agent_alive(state))


def release_graphs(root: str, node: str, skip: tuple = ()) -> int:
    """Remove the compiled graphs (agent/compile_cache.py) of the node's runs that are over: no
    other run loads them. Those of runs in ``skip`` (run ids) stay. The bytes freed."""
    return sum(
        compile_cache.drop(c.path) for c in node_runs(root, node) if c.key not in skip and _over(c.path)
    )


def release_memory(root: str, node: str, skip: tuple = ()) -> list[str]:
    """Remove the trainer's state copies in node memory (/dev/shm) of the node's runs that are
    over: ended, or lost (their agent was killed before it could remove them, so the memory
    would stay taken until a reboot, and a later preflight would find /dev/shm short). A running
    or detached run's stay, as do those of runs in ``skip`` (run ids). The folders removed."""
    freed = []
    for c in node_runs(root, node):
        if c.key in skip or not _over(c.path):
            continue
        for folder in own_shm_snapshot_folders(c.path):
            shutil.rmtree(folder, ignore_errors=True)
            freed.append(folder)
    return freed


def prune_at_start(run_dir: str, node: str, keep: int) -> None:
    """What the agent does as a run starts: the node's older runs beyond ``keep``, the starting
    run never among them, and the memory of the node's runs that are over. Never raises: the run
    must start whatever happens here."""
    try:
        root = posixpath.dirname(posixpath.dirname(run_dir))
        starting = (posixpath.basename(posixpath.dirname(run_dir)),)
        prune(root, node, keep, skip=starting)
        release_memory(root, node, skip=starting)
        release_graphs(root, node, skip=starting)
    except Exception as exc:  # noqa: BLE001 - pruning is housekeeping, never the run's failure
        print("mscon agent: pruning old runs: %s" % exc, file=sys.stderr, flush=True)


def prune_main(
    node: str, cache: str | None, keep: int, older_than_days: float | None = None, dry_run: bool = False
) -> int:
    """``mscon prune`` on a node: a PrunedRun line per run removed (or, dry, that would be), then
    the end of output."""
    from . import protocol as P

    for run_id, size, error in prune(runs_root(cache), node, keep, older_than_days, dry_run):
        line = P.encode(P.PrunedRun(node=node, run_id=run_id, bytes=size, dry_run=dry_run, error=error))
        sys.stdout.write(line)
    sys.stdout.flush()
    return 0
