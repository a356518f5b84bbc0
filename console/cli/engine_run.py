"""What ``mscon run`` and ``mscon check`` (its resume check on nodes too) share: the job the
command line gives (an inventory or ``--hosts``/``--hostfile``, ``--workdir``, the script after
``--``), the preflight checks to skip, and the supervisor run with its recorders and signals."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from pathlib import Path

from mscon.console.cli.job_flags import adhoc_flags
from mscon.console.cli.usage import usage_error
from mscon.console.cli.workdir import script_in_workdir, workdir_of
from mscon.console.config.adhoc import AdhocError, AdhocFlags, apply_flags
from mscon.console.config.adhoc import build_inventory as adhoc_inventory
from mscon.console.config.inventory import Inventory, InventoryError, load_inventory_or_default
from mscon.console.engine import exit_codes
from mscon.console.engine.commands import StopJob
from mscon.console.engine.events import RunResult
from mscon.console.engine.supervisor import Supervisor
from mscon.console.history.recording import RunRecorders
from mscon.console.preflight.runner import all_check_names, known_check

Job = tuple[Inventory, str | None, tuple[str, ...] | None]


def job_of(args: argparse.Namespace, user_cmd: list[str] | None) -> Job | int:
    """The inventory with --workdir applied, and the script and arguments given after --; or an
    exit code after a one-line error."""
    flags = adhoc_flags(args)
    if flags.names_nodes:
        built = adhoc_job_inventory(args, flags, user_cmd)
        if isinstance(built, int):
            return built
        inv = built
    elif flags.nproc_per_node is not None:
        return usage_error(
            "--nproc-per-node: only with --hosts or --hostfile (an inventory's nodes say theirs)"
        )
    else:
        try:
            inv = load_inventory_or_default(args.inventory)
        except InventoryError as exc:
            print(exc.report(), file=sys.stderr)
            return exit_codes.USAGE
    if args.slurm or inv.slurm is not None:
        if getattr(args, "detach", False):
            # srun's step ends with the console (and cgroup tracking ends every process in it).
            return usage_error("--detach: not with Slurm nodes (the srun step ends with the console)")
        from mscon.console.config.slurm import SlurmError, apply_allocation

        try:
            inv = apply_allocation(inv)
        except SlurmError as exc:
            return usage_error(str(exc))
    if not flags.names_nodes:
        try:
            inv = apply_flags(inv, flags)
        except AdhocError as exc:
            return usage_error(str(exc))
    if args.workdir is not None:
        workdir = args.workdir.resolve()
        if not workdir.is_dir():
            return usage_error(f"--workdir: no such directory: {args.workdir}")
        inv = dataclasses.replace(inv, job=dataclasses.replace(inv.job, workdir=workdir))
    script = args_tuple = None
    if user_cmd is not None:
        if not user_cmd:
            return usage_error("nothing after --: give a script, e.g. -- train.py --epochs 1")
        script = script_in_workdir(user_cmd[0], inv.job.workdir)
        if script is None:
            return usage_error(
                f"script {user_cmd[0]} is not a file inside the job workdir {inv.job.workdir} "
                "(the workdir is what gets synced to the nodes; set --workdir or job.workdir)"
            )
        args_tuple = tuple(user_cmd[1:])
    return inv, script, args_tuple


def adhoc_job_inventory(
    args: argparse.Namespace, flags: AdhocFlags, user_cmd: list[str] | None
) -> Inventory | int:
    """The inventory of --hosts/--hostfile: the workdir is --workdir or the current folder (as
    msrun and torchrun run the script from there), the script the one after --."""
    flag = "--hosts" if flags.hosts is not None else "--hostfile"
    if args.inventory is not None:
        return usage_error(
            f"{flag} replaces an inventory, and {args.inventory} was given as one "
            f"(the script goes after --: mscon {args.command} {flag} ... -- train.py)"
        )
    if args.slurm:
        return usage_error(f"{flag}: not with --slurm (the allocation names the nodes)")
    if getattr(args, "detach", False):
        # mscon attach finds a detached run's nodes in the inventory file it records.
        return usage_error(f"--detach: needs an inventory file; write one with: mscon init {flag} ...")
    if not user_cmd:
        return usage_error(f"{flag}: give the script after --, e.g. -- train.py --epochs 1")
    workdir = workdir_of(args.workdir)
    if workdir is None:
        return usage_error(f"--workdir: no such directory: {args.workdir}")
    script = script_in_workdir(user_cmd[0], workdir)
    if script is None:
        return usage_error(
            f"script {user_cmd[0]} is not a file inside the workdir {workdir} "
            "(the current folder unless --workdir; it is what gets synced to the nodes)"
        )
    try:
        return adhoc_inventory(flags, workdir, script, user_cmd[1:])
    except AdhocError as exc:
        return usage_error(str(exc))


def skip_checks(names: list[str]) -> tuple[str, ...] | int:
    unknown = [n for n in names if not known_check(n)]
    if unknown:
        return usage_error(
            f"--skip-check {unknown[0]}: no such check; checks: {', '.join(all_check_names())} "
            "(or one result of them, e.g. limits.nofile)"
        )
    return tuple(dict.fromkeys(names))


async def supervise(
    sup: Supervisor, events: Path | None, loop: asyncio.AbstractEventLoop, history: bool = False
) -> RunResult:
    """Run the supervisor with its recorders attached (--events; ``history``: the run folder's
    recording, for mscon ls and mscon replay RUN_ID) and Ctrl-C/SIGTERM as StopJob."""
    recorder = RunRecorders(sup.bus, sup.logs_dir if history else None, events)
    for sig, why in ((signal.SIGINT, "interrupted (Ctrl-C)"), (signal.SIGTERM, "terminated (SIGTERM)")):
        loop.add_signal_handler(sig, sup.submit, StopJob(why))
    try:
        return await sup.run()
    finally:
        recorder.close()
