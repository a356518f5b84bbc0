"""One run of the resume check's script: started as a process group (a fresh interpreter, msrun,
or a fork of the check), its metrics followed, killed whole."""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Callable


class StepWatch:
    """The highest step in any of the metrics files, read as they grow (whole lines only)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.read = {p: 0 for p in paths}
        self.rest = {p: b"" for p in paths}
        self.top = 0

    def poll(self) -> int:
        for path, offset in self.read.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            self.read[path] = offset + len(chunk)
            *lines, self.rest[path] = (self.rest[path] + chunk).split(b"\n")
            for line in lines:
                try:
                    step = json.loads(line).get("step")
                except (ValueError, AttributeError):
                    continue
                if isinstance(step, int) and not isinstance(step, bool):
                    self.top = max(self.top, step)
        return self.top


class Child:
    """A started run: a process group to poll, and to kill with every process it started (msrun
    starts each rank in a session of its own, out of the group's reach)."""

    def __init__(self, pid: int, reap: Callable[[bool], int | None]) -> None:
        self.pid = pid
        self._reap = reap  # (block) -> exit code, or None while running

    def poll(self) -> int | None:
        return self._reap(False)

    def kill(self) -> None:
        tree = descendants(self.pid)  # before the kill: orphans would leave the tree
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in [self.pid, *tree]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reap(True)
        deadline = time.monotonic() + 10.0
        while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.01)  # a poll: the kernel ends SIGKILLed processes at once, init reaps them


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name: state, ppid, pgrp, session, ..."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """Every live process started by ``pid``, its children's children too (Linux's /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        fields = _stat(int(name)) if name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def spawn(cmd: list[str], environ: dict[str, str], out: Path, cwd: Path | None = None) -> Child:
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=environ,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Child(proc.pid, lambda block: proc.wait() if block else proc.poll())


def fork(
    script: str, args: tuple[str, ...], environ: dict[str, str], out: Path, cwd: Path | None = None
) -> Child:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    pid = os.fork()
    if pid == 0:
        _child(script, args, environ, fd, cwd)
    os.close(fd)
    try:
        os.setpgid(pid, pid)  # also in the child: whichever runs first
    except OSError:
        pass
    done: list[int] = []

    def reap(block: bool) -> int | None:
        if not done:
            got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
            if not got:
                return None
            done.append(os.waitstatus_to_exitcode(status))
        return done[0]

    return Child(pid, reap)


def _child(script: str, args: tuple[str, ...], environ: dict[str, str], fd: int, cwd: Path | None) -> None:
    """The forked run: as ``python script ARGS`` would run it, then exit without returning."""
    code = 1
    try:
        os.setpgid(0, 0)
        if cwd is not None:
            os.chdir(cwd)
        # The check's exit handlers are not the run's (MindSpore's would tear down threads this
        # child never had): only what the script registers runs at its end.
        atexit._clear()  # type: ignore[attr-defined]
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # not a --serve caller's capture
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        code = _run_script(script)
        atexit._run_exitfuncs()  # the library's end of training (its snapshots dropped)
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # not a --serve caller's capture
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - exiting whatever happens
                pass
        os._exit(code)


def _run_script(script: str) -> int:
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return (exc.code or 0) & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
        sys.excepthook(*sys.exc_info())  # the library's hook too: its snapshots stay
        return 1
    return 0
