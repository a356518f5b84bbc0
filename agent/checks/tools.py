"""The node's programs and processes, as the checks ask them: find a tool, run it with a time limit
(its whole process group killed when it runs over), name a process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

from .results import oneline

# Where the device tools live when a non-login shell's PATH lacks them.
_FALLBACK_DIRS = (
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/usr/local/Ascend/driver/tools",
)


class Ran:
    """What a subprocess did: its exit code (None when it ran over its time limit or could not start)
    and its output."""

    def __init__(self, rc: int | None, out: str, err: str, missing: bool = False, error: str = "") -> None:
        self.rc = rc
        self.out = out
        self.err = err
        self.missing = missing
        self.error = error

    @property
    def timed_out(self) -> bool:
        return self.rc is None and not self.missing and not self.error

    def why(self, timeout: float) -> str:
        if self.missing:
            return "not found"
        if self.error:
            return self.error
        if self.timed_out:
            return "no answer within %gs" % timeout
        text = (self.err.strip() or self.out.strip()).splitlines()
        return "exit code %s%s" % (self.rc, (": " + oneline(text[-1], 200)) if text else "")


def run_cmd(argv: list, timeout: float, env: dict | None = None, cwd: str | None = None) -> Ran:
    """Run argv with a time limit; its whole process group is killed when it runs over."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            close_fds=True,
            start_new_session=True,
            universal_newlines=True,
            errors="replace",
        )
    except FileNotFoundError:
        return Ran(None, "", "", missing=True)
    except OSError as exc:
        return Ran(None, "", "", error="cannot run: %s" % (exc.strerror or exc))
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.1))
        return Ran(proc.returncode, out or "", err or "")
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a descendant in another group holds the pipes
            proc.kill()
            out, err = "", ""
        return Ran(None, out or "", err or "")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def find_tool(name: str, env: dict) -> str | None:
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found:
        return found
    for d in _FALLBACK_DIRS:
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def proc_name(pid: int) -> str:
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip() + " "
    except OSError:
        return ""
