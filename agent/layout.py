"""Where a run's files are: the one place that names the folders and files of mscon on a node.

::

    <home>/.cache/mscon/                 cache_folder(home): the node user's mscon folder
      agent-<digest>/mscon_agent/        the deployed agent (digest: console/transport/bundle.py)
        rank/mscon_resume/               the rank-side library, on every rank's PYTHONPATH
      sync/<archive>.tar.gz              synced workdirs (SSH, Slurm)
      warm/<node>/                       kept_folder(): the standby a run kept for the next one
        keeper.sock  keeper.pid          its keeper (agent/keeper.py); <name>.log, <name>.joined
      runs/<run id>/<node>/              run_folder(): this node's part of one run
        journal.jsonl  state.json        what a later attach and `mscon ls` read (journal.py)
        agent.sock  agent.err            a detached agent's socket and stderr
        work/                            the synced workdir, unpacked (never fetched back)
        checkpoints/                     the trainer's checkpoints (fetched only when asked); its
                                         digest names the ranks' snapshot folder in /dev/shm
        resume.key                       the run's snapshot key (0600; never fetched)
        compile_cache/<key>/             MindSpore's compiled graphs, one folder per graph key
                                         (mscon_resume/compile_cache.py; bounded by
                                         agent/compile_cache.py; never fetched)
        spares/<name>.<N>.log            a spare for attempt N: its output until it becomes a rank
                                         (a standby scheduler's, all of it, linked as its
                                         attempt_<N>/sched.log once taken: spares.py)
        attempt_<N>/<name>.log           each process's output (name: "r<rank>" or "sched")
        attempt_<N>/<name>.metrics.jsonl its MSCON_METRICS file

Every folder mscon makes here is 0700 and every file it uploads or writes 0600, whatever the
umask (:func:`private_dirs`, :func:`private_open`; the SFTP upload sets the same modes): another
user of the node reads nothing of it. What the job itself writes (in ``checkpoints/``, the
unpacked ``work/``) keeps its own modes, inside those 0700 folders.

``<home>`` is the home the node's agent runs in (the SSH server's passwd home of the node user;
the console's own for local nodes). The console fetches a run folder, less ``work/`` and (unless
asked: ``--fetch checkpoints``) ``checkpoints/``, to
``<logs dir>/<run id>/<node>/`` (``LOGS_DIR`` by default): the same names inside.

Stdlib only, Python 3.8 syntax (runs on the nodes). Plain string joins (``posixpath``): the
console builds node paths with these too. The Slurm transport sends this file's source ahead
of ``dial.py``'s, so it imports nothing of the agent.
"""

from __future__ import annotations

import os
import posixpath
import stat

CACHE_DIR = ".cache/mscon"  # under the node user's home
AGENT_PREFIX = "agent-"  # + the bundle's digest
RUNS_DIR = "runs"
KEPT_DIR = "warm"
SYNC_DIR = "sync"
WORK_DIR = "work"
CHECKPOINT_DIR = "checkpoints"
SPARES_DIR = "spares"
ATTEMPT_PREFIX = "attempt_"  # + the attempt number
LOG_SUFFIX = ".log"  # a process's output: <name>.log
METRICS_SUFFIX = ".metrics.jsonl"  # its MSCON_METRICS file
JOURNAL = "journal.jsonl"
STATE = "state.json"
SOCKET = "agent.sock"  # bound relative to the run folder: absolute paths may pass the 107-byte limit
ERRORS = "agent.err"  # the daemon's stderr once no console holds it
RANK_LIBRARY_DIR = "rank"  # in the agent's package folder: holds mscon_resume
RESUME_KEY = "resume.key"  # the run's secret that every snapshot of its ranks is MACed with
COMPILE_CACHE_DIR = "compile_cache"  # MindSpore's compiled graphs, kept for the run's later attempts
LOGS_DIR = "mscon-runs"  # the console's default folder for fetched run folders (relative to its cwd)
# What of a run folder stays on the node unless asked for (``mscon run --fetch NAME``): NAME -> its folder.
FETCHED_ON_REQUEST = {"checkpoints": CHECKPOINT_DIR}


def not_fetched(include: tuple = ()) -> frozenset:
    """The top-level names of a run folder the console does not copy back: the synced workdir
    always (it is no log), and each of :data:`FETCHED_ON_REQUEST` not named in ``include``."""
    return frozenset(
        [WORK_DIR, RESUME_KEY, COMPILE_CACHE_DIR]
        + [d for k, d in FETCHED_ON_REQUEST.items() if k not in include]
    )


def plain(name: object) -> bool:
    """One path component: a non-empty string, not ``.``/``..``, no ``/``, NUL or control character."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)
    )


def cache_folder(home: str) -> str:
    """The mscon folder under a node user's ``home``."""
    return posixpath.join(home, CACHE_DIR)


def own_cache_folder() -> str:
    """The mscon folder of whoever runs this code ($HOME, else the passwd home)."""
    return cache_folder(os.path.expanduser("~"))


def runs_root(cache: str | None = None) -> str:
    """Where runs are kept: under ``cache`` (the folder the console's transport built every run
    folder in, whatever $HOME says), else under :func:`own_cache_folder`."""
    return posixpath.join(cache or own_cache_folder(), RUNS_DIR)


def run_parts(run_id: str, node: str) -> tuple:
    """A run folder's path components under the cache folder (both names must be plain:
    ValueError otherwise). Both run id and node name: several nodes may share one home folder."""
    for value in (run_id, node):
        if not plain(value):
            raise ValueError("not a plain name: %r" % (value,))
    return (RUNS_DIR, run_id, node)


def run_folder(cache: str | None, run_id: str, node: str) -> str:
    """The node's folder of a run (``cache`` as for :func:`runs_root`)."""
    return posixpath.join(runs_root(cache), *run_parts(run_id, node)[1:])


def kept_folder(run_dir: str, node: str) -> str:
    """The node's kept standby (agent/keeper.py), beside the runs: it outlives the run that left
    it. Per node name: several nodes may share one home folder."""
    if not plain(node):
        raise ValueError("not a plain name: %r" % (node,))
    cache = posixpath.dirname(posixpath.dirname(posixpath.dirname(run_dir)))
    return posixpath.join(cache, KEPT_DIR, node)


def attempt_name(attempt: int) -> str:
    return "%s%d" % (ATTEMPT_PREFIX, attempt)


def attempt_folder(run_dir: str | os.PathLike, attempt: int) -> str:
    """Where attempt ``attempt``'s process logs and metrics go (a node's or a fetched run folder)."""
    return posixpath.join(run_dir, attempt_name(attempt))


def log_file(attempt_dir: str | os.PathLike, name: str) -> str:
    """Process ``name``'s output (``"r3"``, ``"sched"``) in an attempt folder."""
    return posixpath.join(attempt_dir, name + LOG_SUFFIX)


def metrics_file(attempt_dir: str | os.PathLike, name: str) -> str:
    """Process ``name``'s MSCON_METRICS file in an attempt folder."""
    return posixpath.join(attempt_dir, name + METRICS_SUFFIX)


def log_path(run_dir: str | os.PathLike, attempt: int, name: str) -> str:
    """Process ``name``'s log of attempt ``attempt`` in a run folder (a node's or a fetched one)."""
    return log_file(attempt_folder(run_dir, attempt), name)


def metrics_path(run_dir: str | os.PathLike, attempt: int, name: str) -> str:
    return metrics_file(attempt_folder(run_dir, attempt), name)


def work_folder(run_dir: str) -> str:
    """Where a synced workdir is unpacked and the processes run."""
    return posixpath.join(run_dir, WORK_DIR)


def spares_folder(run_dir: str) -> str:
    return posixpath.join(run_dir, SPARES_DIR)


def spare_log(run_dir: str, name: str, attempt: int) -> str:
    return posixpath.join(run_dir, SPARES_DIR, "%s.%d%s" % (name, attempt, LOG_SUFFIX))


def spare_order(run_dir: str, name: str) -> str:
    """What the agent tells a spare to become (argv, environment, folder, log): JSON."""
    return posixpath.join(run_dir, SPARES_DIR, name + ".order.json")


def spare_joined(run_dir: str, name: str, attempt: int) -> str:
    """There once the spare for attempt ``attempt`` has joined its standby cluster (init() returned)."""
    return posixpath.join(run_dir, SPARES_DIR, "%s.%d.joined" % (name, attempt))


def shm_snapshot_folder(run_dir: str) -> str:
    """Where the ranks keep their per-step state copies in node memory (``mscon_resume/store.py``,
    ``shm_folder`` of the state folder, the run's checkpoint folder: the same digest; a test holds
    the two equal; ``.1`` ... when another user held the name). The agent removes it when the run
    ends on the node: /dev/shm is RAM. Keyed by the run's snapshot key (``resume.key``, what the
    ranks get as MSCON_SNAPSHOT_KEY), so another user on the node, who can work out the run's
    path, cannot take the name and its alternates first; unkeyed when the run has no key (nor
    do its ranks)."""
    import hashlib
    import hmac

    path = os.path.abspath(checkpoint_folder(run_dir)).encode()
    key = _run_key(run_dir)
    if key:
        digest = hmac.new(key, b"shm\0" + path, hashlib.sha256).hexdigest()[:16]
    else:
        digest = hashlib.sha256(path).hexdigest()[:16]
    return posixpath.join("/dev/shm", "mscon-" + digest)


def _run_key(run_dir: str) -> bytes:
    """The run's snapshot key (``resume.key``: hex, this user's, 0600; agent/procs.run_key makes
    it), or b"" when there is none."""
    try:
        fd = os.open(resume_key_file(run_dir), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        try:
            return bytes.fromhex(f.read(4096).decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            return b""


_SHM_ALTERNATES = 8  # mscon_resume/store.py: the names a snapshot folder may take


def own_shm_snapshot_folders(run_dir: str) -> list:
    """The run's snapshot folders in node memory that are this user's (the first name, or one
    of its alternates when another user held it): what the agent may remove."""
    first = shm_snapshot_folder(run_dir)
    found = []
    for path in [first] + ["%s.%d" % (first, i) for i in range(1, _SHM_ALTERNATES)]:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            found.append(path)
    return found


def checkpoint_folder(run_dir: str) -> str:
    return posixpath.join(run_dir, CHECKPOINT_DIR)


def compile_cache_folder(run_dir: str) -> str:
    """Where the run's ranks keep MindSpore's compiled graphs on the node (``$MSCON_COMPILE_CACHE``):
    a restarted attempt, or a spare that becomes a rank, loads them instead of compiling again."""
    return posixpath.join(run_dir, COMPILE_CACHE_DIR)


def resume_key_file(run_dir: str) -> str:
    return posixpath.join(run_dir, RESUME_KEY)


def journal_file(run_dir: str) -> str:
    return posixpath.join(run_dir, JOURNAL)


def state_file(run_dir: str) -> str:
    return posixpath.join(run_dir, STATE)


def socket_file(run_dir: str) -> str:
    return posixpath.join(run_dir, SOCKET)


def errors_file(run_dir: str) -> str:
    return posixpath.join(run_dir, ERRORS)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

# Nothing under a node user's mscon folder is anyone else's to read: every folder mscon makes
# there is 0700, every file it writes 0600, whatever the umask (which only ever takes bits away:
# an odd one may take the owner's too, so each is set again once made).
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_OPEN_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
}


def _in_cache(path: str) -> bool:
    """``path`` is a node user's mscon folder or lies under one."""
    return ("/" + CACHE_DIR + "/") in (path.rstrip("/") + "/")


def _tighten(path: str, st: os.stat_result, mode: int) -> None:
    """Make this user's ``path`` ``mode`` when it is open to others (made by an older mscon, or
    under another umask); someone else's is left alone."""
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def private_dirs(path: str) -> str:
    """Make folder ``path`` and each missing level above it 0700, whatever the umask. Levels that
    exist are left as they are, but for those at or under a node user's mscon folder
    (``.cache/mscon``) that are this user's: they are made 0700 too. ``path`` returned."""
    path = os.path.abspath(path)
    levels = []
    level = path
    while True:
        levels.append(level)
        up = os.path.dirname(level)
        if up == level:
            break
        level = up
    for level in reversed(levels):
        try:
            st = os.stat(level)
        except FileNotFoundError:
            try:
                os.mkdir(level, PRIVATE_DIR)
            except FileExistsError:  # another process (a node sharing this home) made it meanwhile
                st = os.stat(level)
            else:
                os.chmod(level, PRIVATE_DIR)
                continue
        if _in_cache(level) and stat.S_ISDIR(st.st_mode):
            _tighten(level, st, PRIVATE_DIR)
    return path


def private_fd(path: str, flags: int = _OPEN_FLAGS["a"]) -> int:
    """``path`` opened with ``flags`` (created if missing), 0600 whatever the umask: a file made
    earlier (a log appended to by a later attempt) is made 0600 too when it is this user's."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_open(path: str, mode: str = "a", **kwargs):  # noqa: ANN003, ANN201 - as open()
    """``open(path, mode, ...)`` for writing ("w", "a" or "x", text or "b"), the file 0600."""
    fd = private_fd(path, _OPEN_FLAGS[mode.replace("b", "").replace("+", "")[0]])
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def private_bundle(package_dir: str) -> None:
    """The deployed agent's own folders (``agent-<digest>/mscon_agent/`` and its sub-packages, the
    rank library's among them) 0700, each with its ``__pycache__`` made 0700 ahead of Python (which
    makes it under the umask; the bytecode files take their source's mode: 0600). Nothing is done
    for an agent that does not run from a node's mscon folder (an installed mscon)."""
    package_dir = os.path.abspath(package_dir)
    if not _in_cache(package_dir) or not os.path.basename(os.path.dirname(package_dir)).startswith(
        AGENT_PREFIX
    ):
        return
    for folder, subdirs, files in os.walk(package_dir):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        private_dirs(folder)
        if any(f.endswith(".py") for f in files):
            private_dirs(posixpath.join(folder, "__pycache__"))


def fetched_entries(  # noqa: ANN201 - a generator
    dir_fd: int, prefix: str = "", top: bool = True, skip: frozenset | None = None
):
    """What is fetched of a run folder open as ``dir_fd``: ``(path, fd)`` for each folder (fd
    None, before what it holds) and each regular file (an fd open for reading, valid until the
    next item), under their plain names, sorted. Every entry is opened relative to its parent
    without following links, so a link (or one swapped in meanwhile) never reads anything outside
    the run folder; the top-level names in ``skip`` (default :func:`not_fetched`: the synced
    workdir and the checkpoints) are left out."""
    skip = not_fetched() if skip is None else skip
    for name in sorted(os.listdir(dir_fd)):
        if (top and name in skip) or not plain(name):
            continue
        path = posixpath.join(prefix, name) if prefix else name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                yield path, None
                yield from fetched_entries(fd, path, top=False, skip=skip)
            finally:
                os.close(fd)
        elif stat.S_ISREG(st.st_mode):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    yield path, fd
            finally:
                os.close(fd)
