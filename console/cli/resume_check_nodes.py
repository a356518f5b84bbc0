"""``mscon check --resume`` on the cluster's nodes (an inventory with remote nodes, ``--hosts``,
``--hostfile``, ``--slurm``): does the script resume exactly there?

Two runs through mscon's own engine, each as ``mscon run --no-tui`` would run the job:

- U (``check-u-<hex>``): uninterrupted, no restart;
- K+R (``check-kr-<hex>``): ``--max-restarts 1`` with ``MSCON_CHECK_KILL_AT=STEP`` in the job's
  environment: the library makes rank 0 of attempt 0 SIGKILL itself once step STEP is kept on
  every rank, the policy stops the others and restarts the group, and attempt 1 resumes.

Then each rank's records and printed lines of U's attempt 0 against K+R's attempt 1, read from
the fetched run folders, by check_compare's rules: the local check's verdict line and exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mscon.console.cli.engine_run import job_of, skip_checks, supervise
from mscon.console.cli.prerun import refused_before_connecting
from mscon.console.cli.resume_check_runs import attempt_code, last_step, read_attempt
from mscon.console.cli.usage import usage_error
from mscon.console.config.inventory import Inventory
from mscon.console.engine import exit_codes
from mscon.console.engine.events import AttemptSummary, RunResult
from mscon.console.engine.run_options import RunOptions
from mscon.console.engine.supervisor import Supervisor
from mscon.console.preflight.report import CheckReporter
from mscon.console.preflight.runner import Preflight, PreflightOptions

from mscon_resume import env as resume_env
from mscon_resume.check import default_at
from mscon_resume.check_compare import Kind, Run, Verdict, judge


@dataclass(frozen=True)
class NodesCheck:
    """One check: the job, where its run folders go, and the step to kill at (None: the default)."""

    inv: Inventory
    script: str | None
    args: tuple[str, ...] | None
    root: Path  # the fetched run folders: --keep-dir, else a temp folder removed at the end
    at: int | None
    keep: bool
    accept_new_host_keys: bool
    skip: tuple[str, ...]
    token: str  # the two runs' ids: check-u-<token>, check-kr-<token>

    @property
    def u_id(self) -> str:
        return f"check-u-{self.token}"

    @property
    def kr_id(self) -> str:
        return f"check-kr-{self.token}"

    def options(self, run_id: str, max_restarts: int, preflight: Preflight | None) -> RunOptions:
        return RunOptions(
            script=self.script,
            args=self.args,
            run_id=run_id,
            logs_root=self.root,
            accept_new_host_keys=self.accept_new_host_keys,
            max_restarts=max_restarts,
            preflight=preflight,
        )


def with_kill_at(inv: Inventory, step: int) -> Inventory:
    """The inventory with ``MSCON_CHECK_KILL_AT=step`` in its job's environment."""
    env = {**inv.job.env, resume_env.CHECK_KILL_AT: str(step)}
    return dataclasses.replace(inv, job=dataclasses.replace(inv.job, env=env))


def resume_check_nodes(args: argparse.Namespace, user_cmd: list[str] | None) -> int:
    """The check's exit code (``RESUME_CHECK_CODES``), 2 after a one-line error, 130 on Ctrl-C."""
    job = job_of(args, user_cmd)
    if isinstance(job, int):
        return job
    inv, script, script_args = job
    skip = skip_checks(args.skip_check)
    if isinstance(skip, int):
        return skip
    refused = refused_before_connecting(inv)
    if refused:
        return usage_error(refused)
    keep = args.keep_dir is not None
    if keep:
        root = args.keep_dir.resolve()
        if root.exists() and any(root.iterdir()):
            return usage_error(f"--keep-dir {args.keep_dir}: not empty; give a new or empty folder")
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="mscon-resume-check-"))
    check = NodesCheck(
        inv, script, script_args, root, args.at, keep, args.accept_new_host_keys, skip, secrets.token_hex(3)
    )
    try:
        verdict = asyncio.run(_check(check))
    except KeyboardInterrupt:  # a Ctrl-C before the loop installed its handler
        return exit_codes.INTERRUPTED
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    if isinstance(verdict, int):
        return verdict
    print(verdict.line)
    for line in verdict.details:
        print(f"  {line}")
    sys.stdout.flush()
    return verdict.code


async def _check(c: NodesCheck) -> Verdict | int:
    preflight = Preflight(
        PreflightOptions(quick=True, skip=c.skip, shm_path=os.environ.get("MSCON_SHM_PATH") or None)
    )
    _say(f"run 1 of 2: uninterrupted ({c.u_id})")
    u_result = await _engine(c.inv, c.options(c.u_id, 0, preflight), checks=True)
    if u_result.exit_code == exit_codes.INTERRUPTED:
        return exit_codes.INTERRUPTED
    u = read_attempt(c.root / c.u_id, c.u_id, 0, attempt_code(_attempt(u_result, 0)))
    if not u.ranks:
        return Verdict(Kind.FAILS, f"the uninterrupted run failed before any rank ran: {u_result.reason}")
    u_said = f"uninterrupted: {c.u_id}, exit {u.code}, last step {last_step(u)}"
    if u.code != 0:
        return judge(u, u, u, (u_said, *_kept(c)))
    at = c.at or default_at(u)
    _say(f"run 2 of 2: rank 0 killed after step {at}, the group restarted ({c.kr_id})")
    kr_result = await _engine(with_kill_at(c.inv, at), c.options(c.kr_id, 1, None), checks=False)
    if kr_result.exit_code == exit_codes.INTERRUPTED:
        return exit_codes.INTERRUPTED
    first, second = _attempt(kr_result, 0), _attempt(kr_result, 1)
    if first is None:
        return Verdict(Kind.FAILS, f"the killed run failed before any rank ran: {kr_result.reason}")
    k = read_attempt(c.root / c.kr_id, c.kr_id, 0, attempt_code(first))
    if second is None:  # never killed: what ran is a run from the start, as a relaunch that starts over
        said = f"killed: attempt 0 ended by itself before step {at} (exit {k.code}): no restart"
        return judge(u, Run(None, ()), k, (u_said, said, *_kept(c)))
    r = read_attempt(c.root / c.kr_id, c.kr_id, 1, attempt_code(second))
    resumed = r.ranks[0].resumed_after if r.ranks else 0
    details = (
        u_said,
        f"killed: attempt 0 of {c.kr_id}, last step {last_step(k)} (asked: {at}): {first.reason}",
        f"restarted: attempt 1, exit {r.code}, rank 0 resumed after step {resumed}",
    )
    return judge(u, k, r, details + _kept(c))


def _attempt(result: RunResult, n: int) -> AttemptSummary | None:
    return next((a for a in result.attempts if a.attempt == n), None)


async def _engine(inv: Inventory, options: RunOptions, checks: bool) -> RunResult:
    """One run of the job as ``mscon run --no-tui`` runs it, its ranks' output kept in their logs
    (what preflight finds said on stderr)."""
    loop = asyncio.get_running_loop()
    sup = Supervisor(inv, options)
    if checks:
        sup.bus.add_sink("checks", CheckReporter(out=sys.stderr, full=False).handle)
    return await supervise(sup, None, loop, history=True)


def _kept(c: NodesCheck) -> tuple[str, ...]:
    if not c.keep:
        return ()
    what = f"{c.u_id}: uninterrupted; {c.kr_id}: attempt_0 killed, attempt_1 restarted"
    return (f"runs kept in {c.root} ({what})",)


def _say(text: str) -> None:
    print(f"mscon check --resume: {text}", file=sys.stderr, flush=True)
