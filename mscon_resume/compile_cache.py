"""MindSpore's compile cache for a rank under mscon: the first attempt's graphs are kept on the node
and every later attempt (and every spare that becomes a rank) loads them instead of compiling again.

The agent names the run's cache folder (``$MSCON_COMPILE_CACHE``: ``compile_cache/`` in the run's
0700 node folder, agent/layout.py). This rank keeps its graphs in a sub-folder named by
:func:`graph_key`: a digest of everything that changes the graph and that a rank can see (the
script's bytes and the ``.py`` files beside it, its arguments, the MindSpore and Python versions,
the rank count and this rank's place, the ``MS_DEV_``/``MS_JIT`` settings), so a changed script,
MindSpore or rank layout finds another folder, never a stale graph. MindSpore's own check (a hash
of the script and its local imports, ``compile_dependency.hash``) stays behind it.

MindSpore reads ``MS_COMPILER_CACHE_ENABLE``/``MS_COMPILER_CACHE_PATH`` when it compiles, so they are
set here, before the first step. A script that sets either itself (or the context's
``enable_compile_cache``) keeps its own choice.

Which scripts (``$MSCON_GRAPH_CACHE``, the job's environment): ``auto`` (the default) those that
train through ``Model.train`` (:class:`ResumeCallback`: one cell graph a step); ``on`` every
script; ``off`` none. MindSpore calls its compile cache an experimental prototype, and on MindSpore
2.10 (CPU) a hand-written loop's graphs (``value_and_grad`` of a function, then the optimizer) loaded
from it computed wrong losses in one process and failed on the restart of two ranks ("Parameter[1]
has no default param"), while ``Model.train``'s loaded graphs computed the same losses as compiled
ones (docs/resume.md, "Compiled graphs"). Whether the first step loaded the graph or compiled
it is read from the folder: MindSpore rewrites its cache files when it compiles and leaves them
untouched when it loads them (:func:`outcome`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from typing import Any

ROOT = "MSCON_COMPILE_CACHE"  # the agent: the run's cache folder on this node (empty: off)
MODE = "MSCON_GRAPH_CACHE"  # the job: auto (default), on or off
AUTO, ON, OFF = "auto", "on", "off"
MS_ENABLE = "MS_COMPILER_CACHE_ENABLE"
MS_PATH = "MS_COMPILER_CACHE_PATH"
LOADED = "loaded"  # the first step's graph came from the cache (no cache file written)
COMPILED = "compiled"  # the first step compiled its graph (and MindSpore wrote it to the cache)
# Settings that change what MindSpore compiles (the rest of the environment, ports and ids, do not).
GRAPH_ENV_PREFIXES = ("MS_DEV_", "MS_JIT", "MS_ENABLE_", "MS_ALLOC_CONF", "MS_SIMULATION", "DEVICE_TARGET")
_KEY_CHARS = 24
# The .py files beside the script enter the key by content up to this much, by size and time beyond.
_MAX_FILES = 400
_MAX_BYTES = 32 << 20
_SKIP_DIRS = ("__pycache__", "kernel_meta")

_folder: str | None = None  # this process's cache folder, once enabled
_before: dict[str, tuple[int, int, int]] | None = None  # its files as they were before the first step


def script_digest(script: str) -> str:
    """A digest of ``script``'s bytes and of the ``.py`` files under its folder (hidden folders
    and ``__pycache__`` left out): by content up to ``_MAX_FILES`` files or ``_MAX_BYTES`` bytes,
    by size and modification time beyond. OSError if the script cannot be read."""
    h = hashlib.sha256()
    with open(script, "rb") as f:
        h.update(f.read())
    top = os.path.dirname(os.path.abspath(script))
    files = []
    for folder, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        files.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
    budget_files, budget_bytes = _MAX_FILES, _MAX_BYTES
    for path in files:
        rel = os.path.relpath(path, top)
        try:
            st = os.stat(path)
            if budget_files > 0 and st.st_size <= budget_bytes:
                with open(path, "rb") as f:
                    body = f.read()
                budget_files, budget_bytes = budget_files - 1, budget_bytes - len(body)
                h.update(b"\0F" + rel.encode("utf-8", "surrogateescape") + b"\0" + body)
            else:
                stamp = f"\0S{rel}\0{st.st_size}\0{st.st_mtime_ns}"
                h.update(stamp.encode("utf-8", "surrogateescape"))
        except OSError:
            continue  # gone meanwhile: it is not part of this launch
    return h.hexdigest()


def graph_key(
    script_sha: str,
    args: tuple[str, ...],
    mindspore_version: str,
    rank_count: int,
    rank: int,
    settings: dict[str, str],
    python: str = "{}.{}".format(*sys.version_info[:2]),
) -> str:
    """The cache folder's name for one rank's graphs: a digest of ``script_sha`` (:func:`script_digest`),
    the script's ``args``, the MindSpore and Python versions, the rank count, this rank's number and
    the graph-changing ``settings`` (environment, :data:`GRAPH_ENV_PREFIXES`). Any of them changed:
    another name."""
    parts = [
        "script=" + script_sha,
        "args=" + "\0".join(args),
        "mindspore=" + mindspore_version,
        "python=" + python,
        f"ranks={rank_count}",
        f"rank={rank}",
    ]
    parts += [f"env:{k}={settings[k]}" for k in sorted(settings)]
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:_KEY_CHARS]


def graph_settings(environ: Any = None) -> dict[str, str]:
    """The environment's settings that change what MindSpore compiles."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(GRAPH_ENV_PREFIXES)}


def mindspore_version() -> str:
    ms = sys.modules.get("mindspore")
    version = getattr(ms, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib.metadata import version as dist_version

        return dist_version("mindspore")
    except Exception:  # noqa: BLE001 - not installed: no graph to keep either
        return "unknown"


def _private_folder(path: str) -> None:
    """``path`` and the levels below the run's cache folder 0700, whatever the umask; a folder that
    is not this user's, or a link, is refused (OSError): the graphs must not go where others write."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise OSError(f"{path} is not this user's folder")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def mode(environ: Any = None) -> str:
    """The job's choice (``$MSCON_GRAPH_CACHE``): AUTO, ON or OFF (1/true/yes: ON; 0/false/no: OFF)."""
    text = (os.environ if environ is None else environ).get(MODE, "").strip().lower()
    if text in ("1", "true", "yes", ON):
        return ON
    if text in ("0", "false", "no", OFF):
        return OFF
    return AUTO


def wanted(trains_cells: bool, environ: Any = None) -> bool:
    """Whether this script's graphs are kept: ``trains_cells``, it trains through ``Model.train``."""
    chosen = mode(environ)
    return chosen == ON or (chosen == AUTO and trains_cells)


def enable(
    rank: int,
    rank_count: int,
    trains_cells: bool = False,
    script: str | None = None,
    args: tuple[str, ...] | None = None,
) -> str | None:
    """Point MindSpore's compile cache at this rank's folder in the run's cache (once per process);
    the folder, or None where mscon gave none, the job or the script chose otherwise
    (:func:`wanted`), or it cannot be made (said on stderr: the rank then compiles as it would
    have). Call it after any collective of the resume: the graphs compiled before the cache is on
    are not kept, so every attempt keeps and loads the same ones."""
    global _folder, _before
    if _folder is not None:
        return _folder
    root = os.environ.get(ROOT, "").strip()
    if not root or not wanted(trains_cells):
        return None
    if os.environ.get(MS_ENABLE) is not None or os.environ.get(MS_PATH) is not None:
        return None
    if _context_says() is not None:
        return None
    script = script if script is not None else (sys.argv[0] if sys.argv and sys.argv[0] else "")
    args = tuple(args if args is not None else sys.argv[1:])
    try:
        digest = script_digest(script)
        key = graph_key(digest, args, mindspore_version(), rank_count, rank, graph_settings())
        folder = os.path.join(os.path.abspath(root), key)
        _private_folder(os.path.abspath(root))
        _private_folder(folder)
    except OSError as exc:
        print(f"mscon_resume: no compile cache: {exc}", file=sys.stderr, flush=True)
        return None
    os.environ[MS_ENABLE] = "1"
    os.environ[MS_PATH] = folder
    _folder, _before = folder, files_of(folder)
    return folder


def _context_says() -> Any:
    """The script's own ``enable_compile_cache`` context setting (None: not set)."""
    ms = sys.modules.get("mindspore")
    if ms is None:
        return None
    try:
        return ms.get_context("enable_compile_cache")
    except Exception:  # noqa: BLE001 - an older MindSpore without the option
        return None


def files_of(folder: str) -> dict[str, tuple[int, int, int]]:
    """Each regular file under ``folder``: relative path -> (size, modification time, inode)."""
    out = {}
    for here, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(here, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def judge(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> str | None:
    """What the first step did, from the cache's files before and after it: LOADED when there were
    files and none was written, COMPILED when one was written (new or rewritten), None when there
    are none (MindSpore kept nothing: the cache is of no use to this script or device)."""
    if not after:
        return None
    if before and all(before.get(name) == sig for name, sig in after.items()):
        return LOADED
    return COMPILED


def outcome() -> str | None:
    """After the first step: LOADED or COMPILED (:func:`judge`), None when no cache was enabled.
    The graphs MindSpore wrote are made this user's only (it writes them under the umask)."""
    if _folder is None or _before is None:
        return None
    after = files_of(_folder)
    _tighten(_folder)
    return judge(_before, after)


def _tighten(folder: str) -> None:
    for here, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(here, name)
            try:
                st = os.lstat(path)
                if st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                    os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
            except OSError:
                continue


def reset() -> None:
    """Forget this process's folder (tests)."""
    global _folder, _before
    _folder = _before = None
