"""A spare rank process: Python up and MindSpore imported before it is needed, then it becomes a rank.

The agent starts one per process of its node with the next attempt's environment, as a cold
attempt starts (a warm one: once its ranks have stepped). It imports MindSpore, then waits for one line on
stdin: the path of a JSON file (written by the agent) naming the rank's argv, environment, working
folder and log. It then runs the script as ``python SCRIPT ARGS`` would: output to the log, the
environment replaced, ``sys.argv`` and ``sys.path[0]`` the script's, ``__main__`` the script. End of
input without a line: not needed (the run ended), exit quietly.

``--join MARKER``: before waiting, it also joins the next attempt's own MindSpore cluster (its
environment names the standby scheduler port, ``protocol.standby_port``) and creates ``MARKER``
once ``init()`` has returned; the script's own ``init()`` is then a no-op, so the restart skips the
join. The standby scheduler runs its cluster inside ``init()`` and exits with it (as a cold
scheduler does) and reads no order: ``init()`` holds the GIL while it serves, so nothing else in
the process runs. So it keeps the spare's name once its attempt takes it (nothing can rename it
then: only a thread of the process may), and its output stays in its spare log, which the agent
links as the attempt's scheduler log.

Run as a file (``python spare_boot.py``), never imported by the agent: it imports nothing of
mscon, so the script's ``sys.modules`` holds only what it would hold anyway, plus MindSpore.
Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import runpy
import sys

# Its process name (comm) until it becomes a rank, so tools tell it apart (a standby scheduler keeps it)
SPARE_NAME = b"mscon-spare"
WARM_MODULES = ("mindspore", "mindspore.nn", "mindspore.communication", "mindspore.dataset")
_PR_SET_NAME = 15


def _set_name(name: bytes) -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _warm() -> None:
    import importlib

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that cannot import here is imported cold, or fails, in the rank
            break


def _join(marker: str) -> None:
    """Join the standby cluster (the one cost of a restart imports do not cut: seconds of
    heartbeats and address polling), then say so."""
    import importlib

    ms = importlib.import_module("mindspore")  # the nodes' MindSpore (the agent itself never imports it)
    target = os.environ.get("DEVICE_TARGET") or "CPU"
    device_id = os.environ.get("DEVICE_ID", "")
    # The device as a cold rank's script sets it (DEVICE_ID: the local rank, as msrun gives it).
    ms.set_device(target, int(device_id) if device_id.isdigit() else None)
    importlib.import_module("mindspore.communication").init()  # the scheduler: serves, ends with it
    _accept_set_device(ms, target)
    os.close(_private(marker))


def _accept_set_device(ms: object, target: str) -> None:
    """MindSpore refuses ``set_device`` once ``init()`` ran unless it repeats the same target and
    id; the script runs after the standby's ``init()``, so a call naming the same target (with
    another id or none, as scripts written for one device do) stands for the one already made."""
    real = ms.set_device  # type: ignore[attr-defined]

    def set_device(device_target: str, device_id: int | None = None) -> None:
        if device_target == target:
            return
        real(device_target, device_id)

    ms.set_device = set_device  # type: ignore[attr-defined]


def _read_order() -> dict | None:
    line = sys.stdin.readline()
    if not line.strip():
        return None
    with open(line.strip(), encoding="utf-8") as f:
        order = json.load(f)
    os.unlink(line.strip())
    return order


def _private(path: str) -> int:
    """``path`` open for appending, 0600 whatever the umask (layout.private_fd: this file runs
    alone and imports nothing of the agent)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        pass
    return fd


def _redirect(path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    log = _private(path)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _become(order: dict) -> None:
    _redirect(order["log"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # as a cold rank's stdin
    os.close(null)
    os.chdir(order["cwd"])
    os.environ.clear()
    os.environ.update(order["env"])
    argv = order["argv"]
    script = argv[1]
    sys.argv = list(argv[1:])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    _as_entry_script(script)
    _set_name(os.path.basename(argv[0]).encode("utf-8", "replace"))


def _as_entry_script(script: str) -> None:
    """MindSpore noted its entry script (this file) and import path as it was imported here; its
    compile cache checks the entry script and the local files it imports (``graph/api.py``), so
    they are set to what a cold rank's import notes: else a spare's graphs would never match the
    first attempt's, nor would a cold restart load a spare's."""
    api = sys.modules.get("mindspore.graph.api")
    if api is None or not hasattr(api, "entry_script_path"):
        return
    entry = os.path.realpath(script)
    api.entry_script_path = entry  # type: ignore[attr-defined]
    if isinstance(getattr(api, "sys_path", None), list):
        api.sys_path = [p for p in sys.path if p and p != os.path.dirname(entry)]  # type: ignore[attr-defined]


def main() -> None:
    _set_name(SPARE_NAME)
    sys.path.pop(0)  # this file's folder (the agent's): not the script's import path
    sys.path.insert(0, "")
    _warm()
    if sys.argv[1:2] == ["--join"]:
        _join(sys.argv[2])
    order = _read_order()
    if order is None:
        return
    _become(order)
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
