"""Does a script resume exactly? ``python -m mscon_resume.check [options] -- script.py ARGS...``

Runs the script three times, each in its own fresh folder, from the current folder (as the user
would): uninterrupted (U); again, SIGKILLed once a rank's metrics reach step ``--at`` (K); and
relaunched with ``MSCON_RESUME=1`` over K's state folder (R). R must write the records U wrote
for the same steps (the loss bit for bit), the same final digests, print the same lines and exit
the same way. The verdict is one line (its kinds and exit codes: ``check_compare.Kind``), then
details. Stdlib and numpy only here: MindSpore is imported only with ``--fork``, which runs each
run in a forked child of one process that imported it once (saves its import per run; 1 rank).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import env
from .check_compare import Kind, RankRun, Run, Verdict, judge, read_lines, read_records
from .check_run import Child, StepWatch, fork, spawn
from .store import shm_folder

POLL_S = 0.05
DEFAULT_TIMEOUT_S = 600.0
_SET_BY_CHECK = (env.RESUME, env.ATTEMPT, env.STATE_DIR, env.METRICS, env.SNAPSHOT_KEY)
_RUNS = ("u", "k", "r")


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class Options:
    script: str
    args: tuple[str, ...] = ()
    at: int | None = None  # None: about 40 % of U's last step, at least 2
    nproc: int = 1
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S  # for each run
    keep_dir: str | None = None
    fork: bool = False


@dataclass(frozen=True)
class Launch:
    """One run: its folder, the state folder it uses, whether it resumes, and the step it is
    killed at (None: runs to its end)."""

    folder: Path
    state_dir: Path
    resume: bool = False
    kill_at: int | None = None
    work: Path | None = None  # the folder it runs in (K and R share one: they are one run)

    def metrics(self, rank: int) -> Path:
        return self.folder / f"metrics_{rank}.jsonl"

    def output(self, rank: int, nproc: int) -> Path:
        return self.folder / "output.log" if nproc == 1 else self.folder / "logs" / f"worker_{rank}.log"


@dataclass(frozen=True)
class Ended:
    code: int | None  # None: killed by the check, or past the timeout
    killed_at: int | None = None  # the highest step seen when it was killed
    timed_out: bool = False


# ------------------------------------------------------------------ one run


def _environ(opts: Options, launch: Launch) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in _SET_BY_CHECK}
    out.update(opts.env)
    out[env.STATE_DIR] = str(launch.state_dir)
    # msrun's ranks each replace "{rank}" (the library does); one rank needs no replacing
    out[env.METRICS] = str(launch.metrics(0) if opts.nproc == 1 else launch.folder / "metrics_{rank}.jsonl")
    if launch.resume:
        out[env.RESUME] = "1"
    if launch.kill_at is not None and opts.nproc == 1:
        # The library's own fault: killed right after step N is kept, not whenever a poll sees it
        # (a quick step would be several steps on). msrun's ranks would wait for rank 0 in their
        # collective: there the check kills every process once the metrics say N.
        out[env.CHECK_KILL_AT] = str(launch.kill_at)
    out["PYTHONUNBUFFERED"] = "1"  # stdout and stderr in the order printed, the same in every run
    # msrun starts the ranks with the `python` on PATH: this one
    out["PATH"] = os.path.dirname(sys.executable) + os.pathsep + out.get("PATH", "")
    return out


def _start(opts: Options, launch: Launch) -> Child:
    launch.folder.mkdir(parents=True, exist_ok=True)
    environ = _environ(opts, launch)
    out = launch.folder / "output.log"
    if opts.fork:
        return fork(opts.script, opts.args, environ, out, launch.work)
    if opts.nproc == 1:
        return spawn([sys.executable, opts.script, *opts.args], environ, out, launch.work)
    cmd = [
        str(_msrun()),
        f"--worker_num={opts.nproc}",
        f"--local_worker_num={opts.nproc}",
        f"--master_port={_free_port()}",
        "--join=True",
        f"--log_dir={launch.folder / 'logs'}",
        opts.script,
        *opts.args,
    ]
    return spawn(cmd, environ, out, launch.work)


def _late_steps(opts: Options) -> int:
    """Steps past the kill step the check waits before killing itself: a script on one rank dies
    by the library's hand at the step; one without the library only by the check's."""
    return 2 if opts.nproc == 1 else 0


def run_once(opts: Options, launch: Launch) -> tuple[Run, Ended]:
    """Start one run, kill it at its step (if any), and read back what each rank left."""
    child = _start(opts, launch)
    watch = StepWatch([launch.metrics(r) for r in range(opts.nproc)]) if launch.kill_at else None
    deadline = time.monotonic() + opts.timeout_s
    try:
        while True:
            code = child.poll()
            if code is not None:
                ended = Ended(code)
                break
            if (
                watch is not None
                and launch.kill_at is not None
                and watch.poll() >= launch.kill_at + _late_steps(opts)
            ):
                child.kill()
                ended = Ended(None, killed_at=watch.top)
                break
            if time.monotonic() > deadline:
                child.kill()
                ended = Ended(None, timed_out=True)
                break
            time.sleep(POLL_S)  # a poll of the files and the process, not a synchronisation
    except BaseException:
        child.kill()  # Ctrl-C: no run outlives the check
        raise
    # Each run's own folders print as one name, so a script that prints them prints the same.
    same = {str(launch.state_dir): "<state>", str(launch.folder): "<run>"}
    if launch.work is not None:
        same[str(launch.work)] = "<work>"
    ranks = tuple(
        RankRun(read_records(launch.metrics(r)), read_lines(launch.output(r, opts.nproc), same))
        for r in range(opts.nproc)
    )
    return Run(ended.code, ranks, ended.timed_out), ended


# ------------------------------------------------------------------ three runs


def default_at(u: Run) -> int:
    steps = u.ranks[0].steps if u.ranks else {}
    return max(2, round(0.4 * max(steps, default=0)))


def check(opts: Options) -> Verdict:
    """Run U, K and R in a fresh folder (``--keep-dir``'s, else a temp one, removed) and judge."""
    root = Path(opts.keep_dir) if opts.keep_dir else Path(tempfile.mkdtemp(prefix="mscon-resume-check-"))
    u_state, k_state = root / "u" / "state", root / "k" / "state"
    try:
        u_work, k_work = _workdir(root / "u" / "work"), _workdir(root / "k" / "work")
        _say("run 1 of 3: uninterrupted")
        u, u_end = run_once(opts, Launch(root / "u", u_state, work=u_work))
        if u.timed_out or u.code != 0:
            return judge(u, u, u, _kept(opts, root))
        at = opts.at or default_at(u)
        _say(f"run 2 of 3: killed at step {at}")
        k, k_end = run_once(opts, Launch(root / "k", k_state, kill_at=at, work=k_work))
        _say("run 3 of 3: relaunched with MSCON_RESUME=1")
        r, r_end = run_once(opts, Launch(root / "r", k_state, resume=True, work=k_work))
        details = (
            f"uninterrupted: exit {u.code}, last step {max(u.ranks[0].steps, default=0)}",
            _killed(k_end, at),
            f"relaunched: {_ended(r_end)}, rank 0 resumed after step {r.ranks[0].resumed_after}",
        )
        return judge(u, k, r, details + _kept(opts, root))
    finally:
        for state in (u_state, k_state):  # node memory: never kept
            shutil.rmtree(shm_folder(str(state)), ignore_errors=True)
        if not opts.keep_dir:
            shutil.rmtree(root, ignore_errors=True)


def _workdir(work: Path) -> Path:
    """A folder that looks like the current one (a link to each of its entries), in which a run
    writes what it makes (checkpoints, logs) apart from the other run: the uninterrupted run's
    files must not be in the way of the killed and relaunched one, which are one run."""
    work.mkdir(parents=True)
    for entry in Path.cwd().iterdir():
        (work / entry.name).symlink_to(entry)
    return work


def _killed(ended: Ended, at: int) -> str:
    if ended.killed_at is not None:
        return f"killed: SIGKILL once a rank wrote step {ended.killed_at} (asked: {at})"
    if ended.timed_out:
        return f"killed: still short of step {at} at the timeout"
    if ended.code == -signal.SIGKILL:
        return f"killed: SIGKILL by the library once step {at} was kept (MSCON_CHECK_KILL_AT)"
    return f"killed: ended by itself before step {at} ({_ended(ended)})"


def _ended(ended: Ended) -> str:
    return "still running at the timeout" if ended.timed_out else f"exit {ended.code}"


def _kept(opts: Options, root: Path) -> tuple[str, ...]:
    return (f"runs kept in {root} (u: uninterrupted, k: killed, r: relaunched)",) if opts.keep_dir else ()


def _say(text: str) -> None:
    print(f"mscon_resume.check: {text}", file=sys.stderr, flush=True)


def _msrun() -> Path:
    return Path(sys.executable).parent / "msrun"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ the command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def parse(argv: Sequence[str]) -> Options:
    argv = list(argv)
    if "--" not in argv:
        raise UsageError("give the script after --: python -m mscon_resume.check [options] -- train.py ARGS")
    cut = argv.index("--")
    mine, cmd = argv[:cut], argv[cut + 1 :]
    p = _Parser(prog="python -m mscon_resume.check", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--at", type=int, metavar="STEP", help="kill the second run at this step (default: 40%% of the run)"
    )
    p.add_argument("--nproc", type=int, default=1, metavar="N", help="ranks, launched with msrun when over 1")
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="set in every run (repeatable)"
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS", help="for each run")
    p.add_argument("--keep-dir", metavar="DIR", help="run in DIR and keep it (else a temp folder, removed)")
    p.add_argument(
        "--fork", action="store_true", help="fork each run from one process that imported MindSpore"
    )
    a = p.parse_args(mine)
    if not cmd:
        raise UsageError("nothing after --: give the script, e.g. -- train.py --epochs 1")
    if not os.path.isfile(cmd[0]):
        raise UsageError(f"script {cmd[0]}: no such file")
    if a.at is not None and a.at < 1:
        raise UsageError("--at: a step, 1 or more")
    if a.nproc < 1:
        raise UsageError("--nproc: 1 or more")
    if a.timeout <= 0:
        raise UsageError("--timeout: seconds, more than 0")
    if a.fork and a.nproc > 1:
        raise UsageError("--fork: only with --nproc 1 (msrun starts its own ranks)")
    if a.nproc > 1 and not _msrun().is_file():
        raise UsageError(f"--nproc {a.nproc}: needs msrun beside {sys.executable}")
    if a.keep_dir and any((Path(a.keep_dir) / name).exists() for name in _RUNS):
        raise UsageError(f"--keep-dir {a.keep_dir}: holds an earlier check's runs; give an empty folder")
    return Options(cmd[0], tuple(cmd[1:]), a.at, a.nproc, _env_pairs(a.env), a.timeout, a.keep_dir, a.fork)


def _env_pairs(items: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--env {item}: expected KEY=VALUE")
        if key in _SET_BY_CHECK:
            raise UsageError(f"--env {key}: the check sets it for each run")
        out.append((key, value))
    return tuple(out)


def _preload() -> None:
    """--fork: what every run would import, once (a fork shares it)."""
    try:
        import mindspore  # noqa: F401
        import mindspore.dataset  # noqa: F401
    except ImportError as exc:
        _say(f"--fork: cannot import MindSpore here ({exc}); each run imports what it needs")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--serve"]:
        return serve()
    try:
        opts = parse(args)
    except UsageError as exc:
        print(f"mscon_resume.check: {exc}", file=sys.stderr)
        return Kind.USAGE.value
    if opts.fork:
        _preload()
    return _report(check(opts))


def _report(verdict: Verdict) -> int:
    print(verdict.line)
    for line in verdict.details:
        print(f"  {line}")
    sys.stdout.flush()
    return verdict.code


def serve() -> int:
    """``--serve``: many checks, one MindSpore import (the project's own catalogue of scripts
    runs this way). Reads a JSON request a line, ``{"argv": [...], "cwd": "..."}`` (the argv of a
    ``--fork`` check), and answers each with ``{"code": N, "stdout": "..."}``."""
    _preload()
    for request in sys.stdin:
        ask = json.loads(request)
        out = io.StringIO()
        os.chdir(ask["cwd"])
        with contextlib.redirect_stdout(out):
            try:
                opts = parse(ask["argv"])
                code = _report(check(dataclasses.replace(opts, fork=True)))
            except UsageError as exc:
                print(f"mscon_resume.check: {exc}")
                code = Kind.USAGE.value
        sys.__stdout__.write(json.dumps({"code": code, "stdout": out.getvalue()}) + "\n")
        sys.__stdout__.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
