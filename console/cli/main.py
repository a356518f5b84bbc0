"""``mscon``: the command line. The only place that maps outcomes to exit codes."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from mscon.agent.layout import FETCHED_ON_REQUEST, LOGS_DIR
from mscon.console.cli.engine_run import job_of, skip_checks, supervise
from mscon.console.cli.exit_table import exit_codes_text
from mscon.console.cli.job_flags import add_adhoc_flags
from mscon.console.cli.prerun import refused_before_connecting
from mscon.console.cli.resume_check import add_resume_flags, resume_check_main
from mscon.console.cli.usage import MsconParser, json_path_arg, run_id_arg, usage_error
from mscon.console.config.inventory import Inventory
from mscon.console.engine import exit_codes, run_ids
from mscon.console.engine.collector import FreezeAfterSlowPasses
from mscon.console.engine.commands import StopJob
from mscon.console.engine.lines_wanted import ALL_RANKS_UP_TO, RanksSpecError, default_lines, parse_ranks
from mscon.console.engine.stragglers import DEFAULT_FACTOR, DEFAULT_WINDOW
from mscon.console.engine.summary import (
    add_to_summary,
    is_stdout,
    summary_file,
    write_json,
    write_summary,
)
from mscon.console.engine.supervisor import RunOptions, Supervisor
from mscon.console.preflight.report import CheckReporter, preflight_record
from mscon.console.preflight.runner import Preflight, PreflightOptions
from mscon.console.views.headless.reporter import HeadlessReporter


def _version() -> str:
    try:
        return metadata.version("mscon")
    except metadata.PackageNotFoundError:
        return "unknown"


_JSON_HELP = (
    "also write the run summary as JSON to PATH; - writes it to stdout, and the rank output then "
    "goes to stderr with mscon's own lines, so stdout holds only the JSON"
)
_SLURM_HELP = (
    "the nodes of the Slurm allocation this runs in (salloc, sbatch), reached through srun "
    "(as nodes: {from: slurm} in the inventory)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = MsconParser(
        prog="mscon",
        description="A cluster console for MindSpore distributed training.",
        epilog=exit_codes_text(),
    )
    parser.add_argument("-V", "--version", action="version", version=f"mscon {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run_parser(sub, "run", "launch the job of an inventory on every node and follow it")
    # mscon up: the same run, always in the live console (needs a terminal); a parser of its own,
    # not an alias, so that its usage and errors say "mscon up".
    _add_run_parser(sub, "up", "as run, in the live console")
    _add_check_parser(sub)
    _add_replay_parser(sub)
    from mscon.console.cli.runs import add_parsers

    add_parsers(sub)
    from mscon.console.cli.prune import add_parser as add_prune_parser

    add_prune_parser(sub)
    from mscon.console.cli.init import add_parser as add_init_parser

    add_init_parser(sub)
    validate = sub.add_parser(
        "validate",
        help="check inventories without connecting anywhere (what run checks before connecting)",
        description="Load and lint inventories offline, and refuse what mscon run refuses before it "
        "connects (a workdir of /, a home folder, or too large); exit 0 if all are valid, else 2.",
    )
    validate.add_argument("inventories", nargs="+", metavar="INVENTORY")
    from mscon.console.cli.completion import add_completion_parser

    add_completion_parser(sub)
    return parser


def _add_run_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:  # type: ignore[type-arg]
    run = sub.add_parser(
        name,
        help=help_text,
        description="Launch the inventory's job (or the script given after --) on every node, stream "
        "every rank's output, stop everything when a rank fails, and fetch the logs.",
        usage=f"mscon {name} [options] [INVENTORY | --hosts HOST,... --nproc-per-node N] "
        "[-- SCRIPT [ARGS...]]",
    )
    run.add_argument(
        "inventory",
        nargs="?",
        help="inventory YAML (default: the embedded local inventory: ranks on this machine)",
    )
    run.add_argument("--no-tui", action="store_true", help="headless: prefixed logs and a summary")
    run.add_argument(
        "--lines",
        metavar="RANKS",
        type=lines_arg,
        help="--no-tui: print the log lines of these global ranks (e.g. 0,3,8-15; all; none). Default: "
        f"all ranks up to {ALL_RANKS_UP_TO} ranks, rank 0 beyond; every line is fetched at the end",
    )
    run.add_argument("--json", metavar="PATH", type=json_path_arg, help=_JSON_HELP)
    run.add_argument(
        "--logs-dir", metavar="DIR", type=Path, default=Path(LOGS_DIR), help="where fetched logs go"
    )
    run.add_argument(
        "--run-id",
        type=run_id_arg,
        help="use this run id instead of a generated one (letters, digits, '.', '_', '-')",
    )
    run.add_argument(
        "--fetch",
        action="append",
        default=[],
        choices=sorted(FETCHED_ON_REQUEST),
        help="also copy this back from the nodes at the end (repeatable; by default checkpoints stay "
        "on the nodes, in their run folders)",
    )
    run.add_argument("--workdir", type=Path, help="override job.workdir (synced to the nodes)")
    run.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="trust and record host keys of hosts not yet in known_hosts (changed keys are still refused)",
    )
    run.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="restart the whole group from its latest checkpoint up to N times "
        "(default: restart.max_restarts)",
    )
    run.add_argument(
        "--events", metavar="PATH", type=Path, help="record every console event as JSON lines (replayable)"
    )
    run.add_argument("-q", "--quiet", action="store_true", help="fewer mscon status lines")
    run.add_argument(
        "--straggler-factor",
        type=float,
        default=DEFAULT_FACTOR,
        metavar="F",
        help=f"the console marks a rank whose step time is F x the others' median (default {DEFAULT_FACTOR})",
    )
    run.add_argument(
        "--straggler-window",
        type=int,
        default=DEFAULT_WINDOW,
        metavar="N",
        help=f"... over its last N steps (default {DEFAULT_WINDOW})",
    )
    run.add_argument(
        "--skip-check",
        action="append",
        default=[],
        metavar="NAME",
        help="launch even if this preflight check fails (repeatable; recorded in the summary)",
    )
    run.add_argument("--no-check", action="store_true", help="launch without the quick preflight checks")
    run.add_argument(
        "--detach",
        action="store_true",
        help="start the run, then leave it going on the nodes with no console (mscon attach RUN_ID)",
    )
    run.add_argument("--slurm", action="store_true", help=_SLURM_HELP)
    run.add_argument(
        "--no-spares",
        action="store_true",
        help="do not start the next attempt's processes ahead (each spare holds an interpreter with "
        "MindSpore imported, ~0.4 GB, on its node while a restart may come)",
    )
    add_adhoc_flags(run)


def _add_check_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    check = sub.add_parser(
        "check",
        help="run the preflight checks on every node, start nothing",
        description="Check every node of the inventory in parallel (Python, MindSpore, devices, shared "
        "memory, limits, disk, the scheduler port, interfaces, environment, clocks, a TCP mesh between "
        "the nodes, the job's arguments) and run a real AllReduce over every rank. Exit 0 (warnings "
        "printed), 3 if a check failed, 4 if a node could not be reached.",
        usage="mscon check [options] [INVENTORY | --hosts HOST,... --nproc-per-node N] [-- SCRIPT [ARGS...]]",
    )
    check.add_argument("inventory", nargs="?", help="inventory YAML (default: the embedded local inventory)")
    check.add_argument(
        "--json",
        metavar="PATH",
        type=json_path_arg,
        help="also write every result as JSON to PATH; - writes it to stdout, and the table then goes "
        "to stderr, so stdout holds only the JSON",
    )
    check.add_argument(
        "--skip-check", action="append", default=[], metavar="NAME", help="do not run this check (repeatable)"
    )
    check.add_argument(
        "--quick", action="store_true", help="only the quick checks (what mscon run does first)"
    )
    check.add_argument(
        "--collective",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the AllReduce smoke test over every rank (default: on)",
    )
    check.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="after the AllReduce, its bus bandwidth from 1 KiB up (default: on GPU/Ascend, off on CPU)",
    )
    check.add_argument("--workdir", type=Path, help="override job.workdir")
    check.add_argument("--slurm", action="store_true", help=_SLURM_HELP)
    check.add_argument(
        "--logs-dir",
        metavar="DIR",
        type=Path,
        default=Path(LOGS_DIR),
        help="where a failed smoke test's logs are kept",
    )
    check.add_argument(
        "--accept-new-host-keys", action="store_true", help="trust and record host keys of new hosts"
    )
    check.add_argument(
        "--events", metavar="PATH", type=Path, help="record every console event as JSON lines (replayable)"
    )
    add_adhoc_flags(check)
    add_resume_flags(check)


def _add_replay_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    replay = sub.add_parser(
        "replay",
        help="replay a past run (mscon ls lists them) or a recording (--events) in the live console",
        description="Feed a run's recording of console events (every run keeps one in its folder "
        "under --logs-dir) or an --events file into the console at --speed x real time.",
    )
    replay.add_argument("recording", metavar="RUN_ID|EVENTS.jsonl")
    replay.add_argument(
        "--logs-dir", metavar="DIR", type=Path, default=Path(LOGS_DIR), help="where the runs' folders are"
    )
    replay.add_argument(
        "--speed", type=float, default=1.0, help="x real time (default 1; 0: as fast as possible)"
    )


def main(argv: list[str] | None = None) -> int:
    """``mscon ARGV``: its exit status. A reader that leaves early (``mscon ls | head``) ends any
    command here, once: 141 as a shell reports SIGPIPE, and no traceback."""
    try:
        code = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # now, inside the try: at exit it would fail where nobody catches it
    except BrokenPipeError:
        return _stdout_closed()
    return code


def _stdout_closed() -> int:
    """Point stdout at /dev/null, so the interpreter's last flush at exit finds nobody gone."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind sys.stdout (a test's capture)
        pass
    return exit_codes.OUTPUT_CLOSED


def _dispatch(argv: list[str]) -> int:
    user_cmd: list[str] | None = None
    if "--" in argv:
        i = argv.index("--")
        argv, user_cmd = argv[:i], argv[i + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return exit_codes.USAGE
    if args.command in ("run", "up"):
        return _run(parser, args, user_cmd)
    if args.command == "replay":
        return _replay(args)
    if args.command == "check":
        return _check(args, user_cmd)
    if args.command == "init":
        from mscon.console.cli.init import init_main

        return init_main(args, user_cmd)
    if args.command == "validate":
        from mscon.console.cli.validate import validate_main

        return validate_main(args.inventories)
    if args.command in ("attach", "stop", "logs"):
        from mscon.console.cli.runs import attach_main

        return attach_main(args, args.command)
    if args.command == "prune":
        from mscon.console.cli.prune import prune_main

        return prune_main(args)
    if args.command == "ls":
        from mscon.console.cli.runs import ls_main

        return ls_main(args)
    if args.command == "completion":
        from mscon.console.cli.completion import completion_main

        return completion_main(parser, args.shell)
    parser.error(f"unknown command {args.command}")
    return exit_codes.USAGE


def _replay(args: argparse.Namespace) -> int:
    """``mscon replay RUN_ID|EVENTS.jsonl``: a name that is not a file must be a run id."""
    from mscon.console.views.tui.launch import replay_main

    if args.speed < 0:
        return usage_error("--speed: expected 0 (as fast as possible) or more")
    if not Path(args.recording).is_file():
        problem = run_ids.label_problem(args.recording)
        if problem is not None:
            return usage_error(f"RUN_ID|EVENTS.jsonl: no such file, and {problem}")
    return replay_main(args.recording, args.logs_dir, args.speed)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, user_cmd: list[str] | None) -> int:
    job = job_of(args, user_cmd)
    if isinstance(job, int):
        return job
    inv, script, args_tuple = job
    refused = refused_before_connecting(inv)
    if refused:
        return usage_error(refused)
    args.tui = _wants_tui(args) and not args.detach
    if args.command == "up" and not args.tui:
        return usage_error("mscon up needs a terminal (stdin and stdout); use mscon run --no-tui")
    if args.run_id is not None and (args.logs_dir / args.run_id).exists():
        return usage_error(run_ids.reuse_hint(args.run_id, str(args.logs_dir / args.run_id)))
    if not (1.0 < args.straggler_factor <= 100.0 and 2 <= args.straggler_window <= 10_000):
        return usage_error("--straggler-factor: expected 1 < F <= 100; --straggler-window: 2..10000")
    if args.max_restarts is not None and not 0 <= args.max_restarts <= 1000:
        return usage_error(f"--max-restarts: expected 0..1000, got {args.max_restarts}")
    skip = skip_checks(args.skip_check)
    if isinstance(skip, int):
        return skip
    preflight = None
    if not args.no_check:
        preflight = Preflight(
            PreflightOptions(quick=True, skip=skip, shm_path=os.environ.get("MSCON_SHM_PATH") or None)
        )
    options = RunOptions(
        script=script,
        args=args_tuple,
        run_id=args.run_id,
        logs_root=args.logs_dir,
        accept_new_host_keys=args.accept_new_host_keys,
        max_restarts=args.max_restarts,
        preflight=preflight,
        detach=args.detach,
        # A live console keeps a failed run for its operator (r restarts, q ends); headless ends it.
        operator_wait_s=math.inf if args.tui else None,
        straggler_factor=args.straggler_factor,
        straggler_window=args.straggler_window,
        fetch=tuple(dict.fromkeys(args.fetch)),
        spares=not args.no_spares,
    )
    try:
        return asyncio.run(_run_engine(inv, options, args))
    except KeyboardInterrupt:  # a Ctrl-C before the loop installed its handler
        return exit_codes.INTERRUPTED


def lines_arg(text: str) -> str:
    """``--lines RANKS``: checked here (one line, exit 2), read by ``parse_ranks`` at the run."""
    try:
        parse_ranks(text)
    except RanksSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _wants_tui(args: argparse.Namespace) -> bool:
    """The live console at a terminal; headless with --no-tui or when not a terminal."""
    if args.no_tui and args.command != "up":
        return False
    return sys.stdin.isatty() and sys.stdout.isatty()


async def _run_engine(inv: Inventory, options: RunOptions, args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    sup = Supervisor(inv, options)
    if args.tui:
        from mscon.console.views.tui.launch import run_live

        return await run_live(sup, args)

    def output_closed() -> None:  # from the stdout thread
        stop = StopJob("output closed (stdout)", exit_codes.OUTPUT_CLOSED)
        loop.call_soon_threadsafe(sup.submit, stop)

    # --json is written here once the run is over, preflight included (stdout cannot be rewritten).
    rank_out = sys.stderr if is_stdout(args.json) else None
    reporter = HeadlessReporter(out=rank_out, quiet_states=args.quiet, on_output_closed=output_closed)
    sup.bus.add_sink("headless", reporter.handle, busy=reporter.busy)
    lines = getattr(args, "lines", None)
    sup.want_lines("headless", default_lines(inv.world_size) if lines is None else parse_ranks(lines))
    checks = None
    if options.preflight is not None:
        checks = CheckReporter(full=False)
        sup.bus.add_sink("checks", checks.handle)
    # The full passes of the collector over the state's per-rank objects: a tenth of a core
    # at 3,000 nodes (bench/scale.py), half of it with what survived a slow pass frozen.
    collector = FreezeAfterSlowPasses()
    collector.install()
    try:
        result = await supervise(sup, args.events, loop, history=True)
    finally:
        collector.uninstall()
    sections: dict[str, object] = {}
    if checks is not None and checks.finished is not None:
        sections["preflight"] = preflight_record(checks.results, checks.finished)
        # The run's summary also says what preflight found and skipped; where no summary was
        # written, the run said why.
        add_to_summary(summary_file(sup.logs_dir), **sections)
    if args.json is not None:
        try:
            write_summary(args.json, result, **sections)
        except OSError as exc:
            reporter.note(f"cannot write {args.json}: {exc.strerror or exc}")
    return result.exit_code


def _check(args: argparse.Namespace, user_cmd: list[str] | None) -> int:
    if args.resume or args.at is not None or args.keep_dir is not None:
        return resume_check_main(args, user_cmd)
    job = job_of(args, user_cmd)
    if isinstance(job, int):
        return job
    inv, script, args_tuple = job
    skip = skip_checks(args.skip_check)
    if isinstance(skip, int):
        return skip
    preflight = Preflight(
        PreflightOptions(
            quick=args.quick,
            collective=args.collective and not args.quick,
            sweep=args.sweep,
            skip=skip,
            checks_only=True,
            shm_path=os.environ.get("MSCON_SHM_PATH") or None,
            smoke_logs_root=args.logs_dir,
        )
    )
    # A check leaves nothing behind: its own run folder (a summary of no ranks) goes when it ends.
    logs_root = Path(tempfile.mkdtemp(prefix="mscon-check-"))
    options = RunOptions(
        script=script,
        args=args_tuple,
        logs_root=logs_root,
        accept_new_host_keys=args.accept_new_host_keys,
        preflight=preflight,
    )
    try:
        return asyncio.run(_check_engine(inv, options, args))
    except KeyboardInterrupt:  # a Ctrl-C before the loop installed its handler
        return exit_codes.INTERRUPTED
    finally:
        shutil.rmtree(logs_root, ignore_errors=True)


async def _check_engine(inv: Inventory, options: RunOptions, args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    sup = Supervisor(inv, options)
    # --json -: stdout holds only the JSON, so the table goes to stderr.
    reporter = CheckReporter(out=sys.stderr if is_stdout(args.json) else None, full=True)
    sup.bus.add_sink("checks", reporter.handle)
    result = await supervise(sup, args.events, loop)
    if args.json is not None:
        doc = reporter.document(result)
        assert options.preflight is not None
        doc["preflight_s"] = options.preflight.wall_s  # the checks alone, without connecting
        try:
            write_json(args.json, doc)
        except OSError as exc:
            reporter.note(f"cannot write {args.json}: {exc.strerror or exc}")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
