"""``mscon``: the command line. The only place that maps outcomes to exit codes."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from importlib import metadata, resources
from pathlib import Path

from . import exit_codes
from .commands import StopJob
from .inventory import Inventory, InventoryError, load_inventory
from .recorder import EventRecorder
from .reporter import HeadlessReporter
from .supervisor import RunOptions, Supervisor


def _version() -> str:
    try:
        return metadata.version("mscon")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mscon",
        description="A cluster console for MindSpore distributed training.",
        epilog="Exit codes: 0 ok, 2 usage/inventory error, 3 preflight failed, 4 node unreachable, "
        "130 interrupted; a failed run exits with its root-cause rank's code (128 + signal).",
    )
    parser.add_argument("--version", action="version", version=f"mscon {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="launch the job of an inventory on every node and follow it",
        description="Launch the inventory's job (or the script given after --) on every node, stream "
        "every rank's output, stop everything when a rank fails, and fetch the logs.",
        usage="mscon run [options] [INVENTORY] [-- SCRIPT [ARGS...]]",
    )
    run.add_argument(
        "inventory",
        nargs="?",
        help="inventory YAML (default: the embedded local inventory: ranks on this machine)",
    )
    run.add_argument("--no-tui", action="store_true", help="headless: prefixed logs and a summary")
    run.add_argument("--json", metavar="PATH", type=Path, help="also write the run summary as JSON to PATH")
    run.add_argument(
        "--logs-dir", metavar="DIR", type=Path, default=Path("mscon-runs"), help="where fetched logs go"
    )
    run.add_argument("--run-id", help="use this run id instead of a generated one")
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
    validate = sub.add_parser(
        "validate",
        help="check inventories without connecting anywhere",
        description="Load and lint inventories offline; exit 0 if all are valid, else 2.",
    )
    validate.add_argument("inventories", nargs="+", metavar="INVENTORY")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    user_cmd: list[str] | None = None
    if "--" in argv:
        i = argv.index("--")
        argv, user_cmd = argv[:i], argv[i + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return exit_codes.USAGE
    if args.command == "run":
        return _run(parser, args, user_cmd)
    if args.command == "validate":
        from .validate import validate_main

        return validate_main(args.inventories)
    parser.error(f"unknown command {args.command}")
    return exit_codes.USAGE


def _usage_error(message: str) -> int:
    print(f"mscon: error: {message}", file=sys.stderr)
    return exit_codes.USAGE


def _load(path: str | None) -> Inventory:
    if path is not None:
        return load_inventory(path)
    with resources.as_file(resources.files("mscon.inventory").joinpath("local.yaml")) as p:
        return load_inventory(p)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, user_cmd: list[str] | None) -> int:
    try:
        inv = _load(args.inventory)
    except InventoryError as exc:
        print(str(exc), file=sys.stderr)
        return exit_codes.USAGE
    if args.workdir is not None:
        workdir = args.workdir.resolve()
        if not workdir.is_dir():
            return _usage_error(f"--workdir: no such directory: {args.workdir}")
        inv = dataclasses.replace(inv, job=dataclasses.replace(inv.job, workdir=workdir))
    script = args_tuple = None
    if user_cmd is not None:
        if not user_cmd:
            return _usage_error("nothing after --: give a script, e.g. -- train.py --epochs 1")
        script = _script_in_workdir(user_cmd[0], inv.job.workdir)
        if script is None:
            return _usage_error(
                f"script {user_cmd[0]} is not a file inside the job workdir {inv.job.workdir} "
                "(the workdir is what gets synced to the nodes; set --workdir or job.workdir)"
            )
        args_tuple = tuple(user_cmd[1:])
    if not args.no_tui:
        print(
            "mscon: the live console (mscon up) is not part of this version yet; running headless",
            file=sys.stderr,
        )
    if args.run_id is not None and (args.logs_dir / args.run_id).exists():
        return _usage_error(f"--run-id {args.run_id}: already used ({args.logs_dir / args.run_id} exists)")
    if args.max_restarts is not None and not 0 <= args.max_restarts <= 1000:
        return _usage_error(f"--max-restarts: expected 0..1000, got {args.max_restarts}")
    options = RunOptions(
        script=script,
        args=args_tuple,
        run_id=args.run_id,
        logs_root=args.logs_dir,
        accept_new_host_keys=args.accept_new_host_keys,
        max_restarts=args.max_restarts,
    )
    try:
        return asyncio.run(_run_engine(inv, options, args))
    except KeyboardInterrupt:  # a Ctrl-C before the loop installed its handler
        return exit_codes.INTERRUPTED


def _script_in_workdir(given: str, workdir: Path) -> str | None:
    """The script's path relative to the workdir, or None if it is not a file inside it."""
    for candidate in (workdir / given, Path(given)):
        path = candidate.resolve()
        if path.is_file():
            try:
                return path.relative_to(workdir).as_posix()
            except ValueError:
                continue
    return None


async def _run_engine(inv: Inventory, options: RunOptions, args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    sup = Supervisor(inv, options)

    def output_closed() -> None:  # from the stdout thread
        stop = StopJob("output closed (stdout)", exit_codes.OUTPUT_CLOSED)
        loop.call_soon_threadsafe(sup.submit, stop)

    reporter = HeadlessReporter(json_path=args.json, quiet_states=args.quiet, on_output_closed=output_closed)
    sup.bus.add_sink("headless", reporter.handle)
    recorder = None
    if args.events is not None:
        recorder = EventRecorder(args.events)
        sup.bus.add_sink("recorder", recorder.handle, lag_limit=10**9, hard_limit=10**9)
    for sig, why in ((signal.SIGINT, "interrupted (Ctrl-C)"), (signal.SIGTERM, "terminated (SIGTERM)")):
        loop.add_signal_handler(sig, sup.submit, StopJob(why))
    try:
        result = await sup.run()
    finally:
        if recorder is not None:
            recorder.close()
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
