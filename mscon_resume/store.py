"""Snapshots of a rank's training state: private folders, authenticated files, a background writer.

At a step boundary the training thread copies every kept parameter (weights and optimizer state)
straight into the mapped pages of the file it is written as (``Writer``, :class:`Mapped`; the
first snapshot, whose shapes are not known yet, into host memory): the only part a step pays. A
background thread then MACs those bytes where they are, adds the rest (:mod:`snapfile`'s format:
raw arrays, a header, one MAC) and renames the temp file into place. The state's files alternate:
each copy goes over the pages of the oldest, renamed away first. A file's name carries its step,
so a rank killed mid-copy or mid-write leaves only a temp file, never a snapshot; a truncated or
corrupt one fails its MAC and is skipped on resume.

Another user on the node must not read a snapshot, nor make a run load one it planted:

- a folder is used only if this user owns it and nobody else may write or read it (made 0700; a
  name taken by someone else is passed over for the next of a fixed list, said once in the log);
- files are created exclusively (``O_EXCL | O_NOFOLLOW``), mode 0600, never through a link; one
  gone over again is opened ``O_NOFOLLOW`` and used only while it is this user's regular 0600
  file with one name;
- every snapshot carries a MAC (HMAC-SHA256) under the run's key (``MSCON_SNAPSHOT_KEY``, which
  mscon's agent hands its ranks; by hand, a key file made in the private folder), so a file
  written by anyone or anything else is skipped on resume, and said.

Where: ``/dev/shm`` (RAM) when it is writable and has room, else a folder under the state folder
(:func:`candidate_dirs`). Each rank keeps its newest ``KEEP`` snapshots, and drops the oldest
before writing the next: at most ``KEEP`` states on disk at any time, a temp file included.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import mmap
import os
import re
import secrets
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import snapfile

KEEP = 2  # a rank killed mid-write still has the previous one, which every other rank also has
SHM = "/dev/shm"
SHM_PREFIX = "mscon-"  # + a digest of the state folder, keyed (agent/layout.py names the same folder)
_NAME_RE = re.compile(r"^snap_(\d+)" + re.escape(snapfile.SUFFIX) + "$")
_OLD_RE = re.compile(r"^snap_(\d+)\.npz$")  # the format before (np.savez): not read, said, dropped
_TEMP_RE = re.compile(r"^\.snap_\d+\..+\.tmp$")  # a write's temp file (write)
_ALTERNATES = 8  # how many names a private folder may take when others are taken by another user
_SHM_HEADROOM = KEEP  # /dev/shm must hold this many states: KEEP snapshots (a temp file among them)
_KEY_FILE = ".key"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _say(text: str) -> None:
    print(f"mscon_resume: {text}", flush=True)  # the rank's log, beside its output


@dataclass(frozen=True)
class Snapshot:
    """One snapshot read back: its step, metadata and named arrays."""

    step: int
    meta: dict
    arrays: dict[str, np.ndarray]


# ------------------------------------------------------------------ folders


def shm_folder(state_dir: str, shm: str = SHM, key: bytes | None = None) -> str:
    """The /dev/shm folder of a state folder: the same digest ``agent/layout.py`` uses, so the
    agent frees a run's node memory when the run is over. With the run's ``key`` (mscon's
    ``MSCON_SNAPSHOT_KEY``) an HMAC of the folder under it: another user on the node, who can
    work out the folder's path, cannot take the name and its alternates first."""
    path = os.path.abspath(state_dir).encode()
    if key:
        digest = hmac.new(key, b"shm\0" + path, hashlib.sha256).hexdigest()[:16]
    else:
        digest = hashlib.sha256(path).hexdigest()[:16]
    return os.path.join(shm, SHM_PREFIX + digest)


def candidate_dirs(state_dir: str, shm: str = SHM, key: bytes | None = None) -> list[str]:
    """Where this rank's snapshots may be: node memory first, then ``<state dir>/snapshots``."""
    return [shm_folder(state_dir, shm, key), os.path.join(os.path.abspath(state_dir), "snapshots")]


def alternates(folder: str) -> list[str]:
    """The names a private folder may have: ``folder``, then ``folder.1`` ... (the first that is
    this user's, or free, is the one: every rank and attempt of the run finds the same)."""
    return [folder] + [f"{folder}.{i}" for i in range(1, _ALTERNATES)]


def private(path: str) -> bool:
    """Whether ``path`` is a folder (not a link) of this user that nobody else can enter or write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def make_private(folder: str, said: set | None = None) -> str | None:
    """This user's private folder of that name (made 0700), or the first free alternate when
    another user holds the name; None when all are taken or none can be made."""
    for i, path in enumerate(alternates(folder)):
        parent = os.path.dirname(path)
        try:
            if i == 0 and not os.path.isdir(parent):
                os.makedirs(parent, mode=0o700, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            if st.st_mode & 0o077:  # ours, made under an old umask: nobody else may use it now
                try:
                    os.chmod(path, 0o700)
                except OSError:
                    continue
            if i and said is not None and folder not in said:
                said.add(folder)
                _say(f"{folder} is not this user's private folder; snapshots go to {path}")
            return path
    return None


def find_private(folder: str) -> str | None:
    """The folder :func:`make_private` would choose, if it exists (never makes one)."""
    for path in alternates(folder):
        if private(path):
            return path
    return None


def choose_dir(
    candidates: list[str], state_bytes: int, shm: str = SHM, said: set | None = None
) -> str | None:
    """The first candidate that can take the snapshots and is private: one under /dev/shm needs
    it writable with room for ``_SHM_HEADROOM`` states."""
    for folder in candidates:
        if folder.startswith(shm + os.sep) and folder is not candidates[-1]:
            try:
                free = shutil.disk_usage(shm).free if os.access(shm, os.W_OK) else 0
            except OSError:
                free = 0
            if free <= _SHM_HEADROOM * state_bytes:
                continue
        got = make_private(folder, said)
        if got is not None:
            return got
    return None


def rank_dir(root: str, rank: int, stage: str = "") -> str:
    """A rank's folder, or (``stage``: a loop or callback of the script) that stage's in it."""
    folder = os.path.join(root, f"rank_{rank}")
    return os.path.join(folder, stage) if stage else folder


# ------------------------------------------------------------------ the run's key


def folder_key(root: str) -> bytes:
    """The key of a private folder used without mscon: made once (0600, published with a link so
    a rank that loses the race reads a whole key), then read by every rank and attempt."""
    path = os.path.join(root, _KEY_FILE)
    if not os.path.exists(path):
        tmp = os.path.join(root, f".key.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another rank's key is the folder's
        finally:
            os.remove(tmp)
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise OSError(f"{path} is not this user's private file")
        key = f.read()
    if len(key) < 32:
        raise OSError(f"{path} holds no key")
    return key


# ------------------------------------------------------------------ files


def named_params(payload: Any) -> list[tuple[str, Any]]:
    """(name, Parameter) of what is kept: a Cell, or a list of {"name", "data"}."""
    if isinstance(payload, list):
        return [(d["name"], d["data"]) for d in payload]
    return [(p.name, p) for p in payload.get_parameters()]


def take(params: list[tuple[str, Any]], into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A host copy of every parameter, taken between steps (``asnumpy`` shares the tensor's memory
    on CPU, and the next step updates it in place: hence the copy). ``into``: arrays of an earlier
    copy that nothing reads any more, copied over where name, shape and dtype match: memory whose
    pages are already there (a fresh copy of ResNet-18's 89 MiB took 33 ms, one over warm arrays
    9 ms, most of it the page faults)."""
    out: dict[str, np.ndarray] = {}
    for name, p in params:
        src = p.asnumpy()
        old = into.get(name) if into is not None else None
        if old is not None and old.shape == src.shape and old.dtype == src.dtype:
            np.copyto(old, src)
            out[name] = old
        else:
            out[name] = np.array(src, copy=True)
    return out


def steps(root: str, rank: int, stage: str = "") -> list[int]:
    """The steps this rank has a snapshot file of, oldest first (not yet checked)."""
    try:
        names = os.listdir(rank_dir(root, rank, stage))
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME_RE.match, names) if m)


def path(root: str, rank: int, step: int, stage: str = "") -> str:
    return os.path.join(rank_dir(root, rank, stage), f"snap_{step}{snapfile.SUFFIX}")


def _temp(folder: str, step: int) -> str:
    return os.path.join(folder, f".snap_{step}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _drop(root: str, rank: int, step: int, keep: int, stage: str = "", into: str | None = None) -> str | None:
    """Before ``step`` is written: the snapshots it supersedes (steps not older: an abandoned
    launch's, which a fresh start or a resume from an older step finds), a killed write's temp
    file, files of the format before, and the oldest beyond ``keep``. Without ``into`` (the temp
    file this write goes into, kept), the first of the dropped snapshots is renamed to a temp
    name, not removed: its path is returned, for the write to go over its pages."""
    folder = rank_dir(root, rank, stage)
    have = steps(root, rank, stage)
    older = [s for s in have if s < step]
    gone = [
        os.path.basename(path(root, rank, s, stage))
        for s in have
        if s >= step or s in older[: max(len(older) - keep, 0)]
    ]
    spare = os.path.basename(into) if into is not None else None
    stale = [n for n in _names(folder) if (_TEMP_RE.match(n) or _OLD_RE.match(n)) and n != spare]
    reuse = None
    for name in gone:
        try:
            if reuse is None and into is None:
                tmp = _temp(folder, step)
                os.rename(os.path.join(folder, name), tmp)  # the name goes at once: never a snapshot again
                reuse = tmp
            else:
                os.remove(os.path.join(folder, name))
        except FileNotFoundError:
            pass
    for name in stale:
        try:
            os.remove(os.path.join(folder, name))
        except FileNotFoundError:
            pass
    return reuse


def _open_reused(tmp: str) -> int | None:
    """The dropped snapshot's file at ``tmp``, open for writing over, if it is still a private
    regular file of this user with no other name (else removed: the write makes a new one)."""
    try:
        fd = os.open(tmp, os.O_RDWR | _NOFOLLOW)
    except OSError:
        fd = -1
    if fd >= 0:
        st = os.fstat(fd)
        if (
            stat.S_ISREG(st.st_mode)
            and st.st_uid == os.getuid()
            and not st.st_mode & 0o077
            and st.st_nlink == 1
        ):
            return fd
        os.close(fd)
    try:
        os.remove(tmp)
    except FileNotFoundError:
        pass
    return None


@dataclass(frozen=True)
class Written:
    """One snapshot written: where, and what its parts cost the writing thread (CPU seconds)."""

    path: str
    mac_s: float
    io_s: float
    reused: bool  # over a dropped snapshot's pages


def write(
    root: str,
    rank: int,
    step: int,
    arrays: dict[str, np.ndarray],
    meta: dict,
    key: bytes,
    keep: int = KEEP,
    stage: str = "",
    into: str | None = None,
    placed: frozenset = frozenset(),
) -> Written:
    """Write one snapshot: the oldest beyond ``keep - 1`` (and any it supersedes) dropped first,
    its file renamed to a temp name and written over (else a temp file made exclusively: 0600,
    never through a link), then renamed into place. ``into``: the temp file (a :class:`Mapped`
    one's) that already holds the ``placed`` arrays where :func:`snapfile.place` puts them."""
    for folder in dict.fromkeys([rank_dir(root, rank), rank_dir(root, rank, stage)]):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            if not private(folder):
                raise OSError(f"{folder} is not this user's private folder") from None
    reuse = _drop(root, rank, step, keep - 1, stage, into)
    final = path(root, rank, step, stage)
    if into is not None:
        fd = _open_reused(into)
        if fd is None:
            raise OSError(f"{into} is no longer this user's private file")
        tmp = into
    else:
        fd = _open_reused(reuse) if reuse is not None else None
        tmp = reuse if fd is not None else _temp(folder, step)
    if fd is None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    info = {**meta, "step": step, "saved_at": time.time()}
    try:
        with os.fdopen(fd, "r+b" if tmp in (reuse, into) else "wb") as f:
            costs = snapfile.dump(f, arrays, info, key, placed)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return Written(final, costs.mac_s, costs.io_s, tmp in (reuse, into))


class Mapped:
    """A snapshot file whose pages the training thread copies the parameters into (mapped): its
    write then MACs them where they are and adds the rest, no second copy of the state. The
    state's files alternate: each copy goes into the oldest, renamed away from its snapshot
    name first (dropped), whose pages node memory already holds."""

    def __init__(self, folder: str, step: int, index: list[list], end: int, adopt: str | None = None) -> None:
        """``index``, ``end``: :func:`snapfile.place` of the parameters' copy before. ``adopt``: a
        dropped snapshot's file, renamed to a temp name, whose pages to go over."""
        self.layout = [entry[:3] for entry in index]
        self.written = False  # renamed into place as a snapshot: the one to go over next but one
        if not hasattr(os, "posix_fallocate"):
            raise OSError("no posix_fallocate on this system")
        fd = _open_reused(adopt) if adopt is not None else None
        self.path = adopt if fd is not None and adopt is not None else _temp(folder, step)
        if fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        try:
            # Room for every page now, or OSError: a copy into a page that node memory cannot
            # back would be SIGBUS, killing the rank.
            os.posix_fallocate(fd, 0, end)
            self._map = mmap.mmap(fd, end)
        except BaseException:
            os.close(fd)
            os.remove(self.path)
            raise
        os.close(fd)
        self.views = {
            name: np.frombuffer(self._map, np.dtype(dtype), math.prod(shape), offset).reshape(shape)
            for name, dtype, shape, offset in index
            if math.prod(shape)
        }

    def close(self) -> None:
        """Unmap (the file stays, a snapshot or a temp file the next write drops)."""
        self.views = {}
        try:
            self._map.close()
        except BufferError:
            pass  # a copy's array still held somewhere: unmapped when it goes


def read(root: str, rank: int, step: int, key: bytes, stage: str = "") -> Snapshot | None:
    """The snapshot of ``step``, or None (said) when it is missing, damaged, not this user's, or
    not written under ``key`` (planted, or another run's)."""
    where = path(root, rank, step, stage)
    try:
        fd = os.open(where, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd, "rb", buffering=0) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                _say(f"{where} is not this user's file; skipped")
                return None
            data = bytearray(st.st_size)
            got = f.readinto(data)
        if got != st.st_size:
            raise snapfile.Unreadable("changed while read")
        info, arrays = snapfile.load(data, key)
    except snapfile.MacMismatch:
        _say(
            f"snapshot of step {step} (rank {rank}) skipped: its MAC does not match (damaged, cut short, "
            f"or not written by this run): {where}"
        )
        return None
    except (OSError, ValueError) as exc:
        _say(f"snapshot of step {step} (rank {rank}) unreadable ({type(exc).__name__}); skipped")
        return None
    if not isinstance(info, dict) or info.get("step") != step:
        return None
    return Snapshot(step, info, arrays)


def _say_old_format(root: str, rank: int, stage: str) -> None:
    """Snapshots of the format before (an upgrade between a failure and its relaunch) are not
    read: said once per folder, so the start afresh is explained."""
    folder = rank_dir(root, rank, stage)
    old = sorted(n for n in _names(folder) if _OLD_RE.match(n))
    if old:
        _say(f"{folder}: {', '.join(old)} of an earlier mscon_resume's format, not read (start afresh)")


def newest_valid(roots: list[str], rank: int, key: bytes | None, stage: str = "") -> list[Snapshot]:
    """This rank's authentic snapshots in any of ``roots`` (each found as :func:`find_private`
    would), newest first, at most ``KEEP``: only those can be common to every rank."""
    found: dict[int, Snapshot] = {}
    for root in roots:
        mine = find_private(root)
        if mine is None:
            continue
        use = key if key is not None else _existing_key(mine)
        if use is None:
            continue
        _say_old_format(mine, rank, stage)
        for step in reversed(steps(mine, rank, stage)):
            if step not in found and len(found) < KEEP:
                snap = read(mine, rank, step, use, stage)
                if snap is not None:
                    found[step] = snap
    return [found[s] for s in sorted(found, reverse=True)]


def _existing_key(root: str) -> bytes | None:
    if not os.path.exists(os.path.join(root, _KEY_FILE)):
        return None
    try:
        return folder_key(root)
    except OSError as exc:
        _say(f"{exc}; its snapshots are not used")
        return None


def remove(roots: list[str], rank: int) -> None:
    """Drop this rank's snapshots (training finished: nothing left to resume), and each root once
    no rank uses it: /dev/shm is memory."""
    for root in roots:
        mine = find_private(root)
        if mine is None:
            continue
        shutil.rmtree(rank_dir(mine, rank), ignore_errors=True)
        if not any(n.startswith("rank_") for n in _names(mine)):
            try:
                os.remove(os.path.join(mine, _KEY_FILE))
            except OSError:
                pass
            try:
                os.rmdir(mine)
            except OSError:
                pass  # another rank's folder is still there


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


class Writer:
    """Writes snapshots on one background thread. ``submit`` waits for the previous write first
    (so every rank writes the same steps: a skipped step on one rank would leave the ranks without
    a common one), then copies the parameters at the step boundary into the pages of a
    :class:`Mapped` file (from the second snapshot on, once their shapes are known; else into
    host memory) and hands it over."""

    def __init__(self, root: str, rank: int, key: bytes, keep: int = KEEP, stage: str = "") -> None:
        self.root, self.rank, self.key, self.keep, self.stage = root, rank, key, keep, stage
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.copy_s = 0.0  # time the training thread spent copying, all snapshots together
        # Each copy's and each write's CPU time (the thread's own: what a snapshot costs, however
        # busy the machine; the first copies pay the memory's page faults).
        self.copies: list[float] = []
        self.writes: list[float] = []
        self.macs: list[float] = []  # each write's MAC, a part of its CPU time
        self.ios: list[float] = []  # each write's bytes into its file (none for a mapped copy's)
        self.wait_s = 0.0  # time it spent waiting for the previous write
        self.waits: list[float] = []  # each wait (wall): the step stalls while a write cannot keep up
        self.write_s = 0.0  # time the background thread spent writing
        self.count = 0
        self._files: list[Mapped] = []  # oldest first: at most ``keep``
        self._last: tuple[list[list], int] | None = None  # where the copy before went in its file
        # The copy before, when it went to host memory (no mapped file): written by the time the
        # next copy is taken (submit waits first), so that copy goes over its warm pages.
        self._host: dict[str, np.ndarray] | None = None
        self._said_unmapped = False

    def submit(self, step: int, params: list[tuple[str, Any]], meta: dict, extra: dict | None = None) -> None:
        t0 = time.perf_counter()
        self.wait()  # the file this copy goes into is a snapshot until the write before is done
        t1, c1 = time.perf_counter(), time.thread_time()
        into = self._file(step)
        mine = take(params, into=into.views if into is not None else self._host)
        placed: frozenset = frozenset()
        if into is not None and [e[:3] for e in snapfile.place(mine)[0]] == into.layout:
            placed = frozenset(n for n, v in into.views.items() if mine[n] is v)
        elif into is not None:  # the parameters changed shape: this copy as a new file, out of the map
            mine = {k: np.array(v, copy=True) if into.views.get(k) is v else v for k, v in mine.items()}
            self._files.remove(into)
            into.close()
            try:
                os.remove(into.path)
            except OSError:
                pass  # a temp file: the next write drops it
            into = None
        self._last = snapfile.place(mine)
        self._host = mine if into is None else None
        arrays = {**mine, **(extra or {})}
        self.copies.append(time.thread_time() - c1)
        self.copy_s += time.perf_counter() - t1
        self.waits.append(t1 - t0)
        self.wait_s += self.waits[-1]
        self.count += 1
        self._thread = threading.Thread(
            target=self._write, args=(step, arrays, meta, into, placed), name="mscon-snapshot", daemon=True
        )
        self._thread.start()

    def _file(self, step: int) -> Mapped | None:
        """The mapped file this step's copy goes into: the oldest of ours once ``keep`` are
        written, renamed from its snapshot's name to a temp one; else a new one. None (a copy into
        host memory): the first snapshot (the parameters' shapes unknown), or none can be made."""
        if self._last is None:
            return None
        for f in [f for f in self._files if not f.written]:  # its write failed: the file is gone
            self._files.remove(f)
            f.close()
        want = [e[:3] for e in self._last[0]]
        if len(self._files) >= self.keep or (self._files and self._files[0].layout != want):
            oldest = self._files.pop(0)
            if oldest.layout == want:
                tmp = _temp(os.path.dirname(oldest.path), step)
                try:
                    os.rename(oldest.path, tmp)  # dropped: never read as a snapshot again
                except OSError:
                    oldest.close()
                else:
                    oldest.path, oldest.written = tmp, False
                    self._files.append(oldest)
                    return oldest
            else:
                oldest.close()
        folder = rank_dir(self.root, self.rank, self.stage)
        try:
            # What this step's write would drop goes first (at most ``keep`` states on disk), the
            # first of it renamed to a temp name to go over its pages.
            adopt = _drop(self.root, self.rank, step, self.keep - 1, self.stage)
            new = Mapped(folder, step, *self._last, adopt=adopt)
        except (OSError, ValueError) as exc:  # no room, or no mapping here: host memory, as before
            if not self._said_unmapped:
                self._said_unmapped = True
                _say(f"snapshots copied to host memory, not into their files' pages ({exc})")
            return None
        self._files.append(new)
        return new

    def _write(
        self, step: int, arrays: dict[str, np.ndarray], meta: dict, into: Mapped | None, placed: frozenset
    ) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            done = write(
                self.root,
                self.rank,
                step,
                arrays,
                meta,
                self.key,
                self.keep,
                self.stage,
                into.path if into is not None else None,
                placed,
            )
            self.macs.append(done.mac_s)
            self.ios.append(done.io_s)
            if into is not None:
                into.path, into.written = done.path, True
        except OSError as exc:  # a full /dev/shm must not stop training
            if self.error is None:
                _say(f"snapshot of step {step} not written: {exc}")
            self.error = exc
        self.write_s += time.perf_counter() - t0
        self.writes.append(time.thread_time() - c0)

    def close(self) -> None:
        """The last write awaited and every file unmapped (they stay: snapshots, or removed)."""
        self.wait()
        for f in self._files:
            f.close()
        self._files = []

    WARM_AFTER = 2  # snapshots
    # The first snapshots fault their memory in (the first copy's host arrays, the first two mapped
    # files' pages, the first write's new file): a third of ResNet-18's copies cost 30 ms, the rest
    # 14. What each costs from then on is what the auto interval weighs: the median from the third.

    def typical_copy_s(self) -> float:
        """The median copy's CPU time: what a snapshot costs the step once memory is warm."""
        return _median(_warm(self.copies))

    def typical_write_s(self) -> float:
        """The median background write's CPU time, once memory is warm."""
        return _median(_warm(self.writes))

    def typical_wait_s(self) -> float:
        """The median wait of a submit for the write before it (wall time)."""
        return _median(_warm(self.waits))

    def typical_mac_s(self) -> float:
        """The median write's MAC (CPU time): a part of :meth:`typical_write_s`."""
        return _median(_warm(self.macs))

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def summary(self) -> str:
        n = max(self.count, 1)
        return (
            f"{self.count} snapshot(s) to {rank_dir(self.root, self.rank, self.stage)}: "
            f"copy {1e3 * self.copy_s / n:.2f} ms, "
            f"wait {1e3 * self.wait_s / n:.2f} ms on the step, write {1e3 * self.write_s / n:.2f} ms in the "
            f"background (its MAC {1e3 * self.typical_mac_s():.2f} ms CPU), each"
        )


def _warm(values: list[float]) -> list[float]:
    """The values from the third snapshot on, once there are such (see ``Writer``)."""
    return values[Writer.WARM_AFTER :] if len(values) > Writer.WARM_AFTER else values


def _median(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
