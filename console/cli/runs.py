"""``mscon attach``, ``mscon stop``, ``mscon logs`` and ``mscon ls``: runs that outlive a console."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from mscon.agent.layout import LOGS_DIR
from mscon.agent.protocol import LogBatch, RunInfo
from mscon.console.cli.usage import json_path_arg, run_id_arg, usage_error
from mscon.console.config.adhoc import AdhocError, AdhocFlags
from mscon.console.config.adhoc import build_inventory as adhoc_inventory
from mscon.console.config.inventory import Inventory, InventoryError, load_inventory_or_default
from mscon.console.detach.attach import Attacher, AttachOptions
from mscon.console.detach.record import DetachRecord, read_record
from mscon.console.engine import exit_codes
from mscon.console.engine.commands import DetachRun
from mscon.console.engine.events import AgentEvent, Event, JobState, RunFinished
from mscon.console.engine.plan import build_plan
from mscon.console.engine.session import ClusterSession
from mscon.console.transport.base import printable
from mscon.console.views.headless.reporter import HeadlessReporter, StdoutWriter

_JSON_HELP = (
    "write the run summary as JSON to PATH; - writes it to stdout, and the rank output then goes to "
    "stderr with mscon's own lines, so stdout holds only the JSON"
)


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    attach = sub.add_parser(
        "attach",
        help="reconnect to a detached run and follow it (live console at a terminal)",
        description="Reconnect to every node of a detached run, replay what this console has not "
        "shown yet (every log line once), and follow the run. Leaving (q, Ctrl-C) never stops it.",
    )
    _common(attach)
    attach.add_argument("--no-tui", action="store_true", help="headless: prefixed logs and a summary")
    attach.add_argument("--read-only", action="store_true", help="watch only (another console may steer)")
    attach.add_argument("--json", metavar="PATH", type=json_path_arg, help=_JSON_HELP)
    stop = sub.add_parser(
        "stop",
        help="stop a detached run and fetch its logs",
        description="Stop every rank of a detached run.",
    )
    _common(stop)
    stop.add_argument("--json", metavar="PATH", type=json_path_arg, help=_JSON_HELP)
    logs = sub.add_parser(
        "logs",
        help="print (or follow) the logs of a run on its nodes",
        description="Print every rank's log of a run's current attempt as the nodes hold it.",
    )
    _common(logs)
    logs.add_argument("--rank", type=int, action="append", metavar="N", help="only rank N (repeatable)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep following the run's logs")
    ls = sub.add_parser(
        "ls",
        help="list past runs (status, root cause, size), or the runs the nodes hold",
        description="With no inventory: the runs in --logs-dir, newest first (status, attempts, root "
        "cause, duration, start, size on disk). With an inventory, --hosts or --nodes: the runs the "
        "nodes hold.",
    )
    ls.add_argument("inventory", nargs="?", help="inventory YAML: list the runs its nodes hold")
    ls.add_argument("--hosts", metavar="HOST,HOST", help="list the runs these nodes hold (as `ssh HOST`)")
    ls.add_argument(
        "--nodes", action="store_true", help="list the runs the nodes hold (default: the local inventory's)"
    )
    ls.add_argument(
        "--logs-dir", metavar="DIR", type=Path, default=Path(LOGS_DIR), help="where past runs' folders are"
    )
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.add_argument("--accept-new-host-keys", action="store_true", help="trust and record new host keys")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN_ID", type=run_id_arg)
    p.add_argument(
        "inventory",
        nargs="?",
        help="inventory YAML (default: the one the run was started with, from the logs folder)",
    )
    p.add_argument(
        "--logs-dir", metavar="DIR", type=Path, default=Path(LOGS_DIR), help="where fetched logs go"
    )
    p.add_argument("--accept-new-host-keys", action="store_true", help="trust and record new host keys")


def _inventory(path: str | None, record: DetachRecord | None) -> Inventory:
    """The inventory given, else the one the run was started with, else the embedded default."""
    if path is None and record is not None:
        path = record.inventory
    return load_inventory_or_default(path)


def _setup(args: argparse.Namespace, command: str) -> tuple[Inventory, DetachRecord | None] | int:
    record = read_record(args.logs_dir / args.run_id)  # RUN_ID is a label (run_id_arg)
    # Before the inventory: a run that is over needs none (and its file may be gone).
    over = _nothing_on_the_nodes(args.logs_dir, args.run_id, record, command)
    if over is not None:
        print(f"mscon: {over}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        inv = _inventory(args.inventory, record)
    except InventoryError as exc:
        print(exc.report(), file=sys.stderr)
        return exit_codes.USAGE
    return inv, record


def attach_main(args: argparse.Namespace, command: str) -> int:
    setup = _setup(args, command)
    if isinstance(setup, int):
        return setup
    inv, record = setup
    if command in ("attach", "stop") and not (args.logs_dir / args.run_id).exists():
        refused = _refuse_unknown_run(inv, args)
        if refused is not None:
            return refused
    options = AttachOptions(
        run_id=args.run_id,
        logs_root=args.logs_dir,
        record=record if command == "attach" else None,
        follow=command != "logs" or args.follow,
        read_only=command == "logs" or getattr(args, "read_only", False),
        stop=command == "stop",
        accept_new_host_keys=args.accept_new_host_keys,
        interactive=_wants_tui(args, command),
    )
    attacher = Attacher(inv, options)
    try:
        return asyncio.run(_attach(attacher, args, command))
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED


_NOTHING_TO = {"attach": "nothing to attach to", "stop": "nothing to stop", "logs": "no logs to follow"}


def _nothing_on_the_nodes(
    logs_dir: Path, run_id: str, record: DetachRecord | None, command: str
) -> str | None:
    """Why a run this logs folder holds has nothing on the nodes for ``command``: it was never
    detached (its console followed it to the end, or still does), or it was and has ended. None
    where the nodes must be asked (a detached run, or one this folder does not know)."""
    from mscon.console.history.runs import read_run

    folder = logs_dir / run_id
    past = read_run(folder) if folder.is_dir() else None
    if past is None:
        return None
    if record is None:
        what = f"run {run_id} was not detached (its console follows a run to its end)"
    elif past.status is not None and past.status.final and past.status is not JobState.DETACHED:
        what = f"run {run_id} has ended ({past.status_word})"
    else:
        return None
    shown = folder.as_posix() if folder.is_absolute() else f"./{folder.as_posix()}"
    return f"{what}: {_NOTHING_TO[command]}; mscon replay {run_id} shows it, its logs are in {shown}"


def _refuse_unknown_run(inv: Inventory, args: argparse.Namespace) -> int | None:
    """A run this logs folder never held: ask the nodes, as ``mscon ls`` does, before anything is
    shown or created. None where a node holds it; else one line and the exit code."""
    try:
        runs, errors = asyncio.run(_list(inv, args.accept_new_host_keys))
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    if any(r.run_id == args.run_id for r in runs):
        return None
    folder = args.logs_dir.as_posix() if args.logs_dir.is_absolute() else f"./{args.logs_dir.as_posix()}"
    for error in errors:
        print(f"mscon: {printable(error)}", file=sys.stderr)
    if errors:  # the run may be on a node that did not answer
        print(f"mscon: no run {args.run_id}: not in {folder} nor on the nodes that answered", file=sys.stderr)
        return exit_codes.UNREACHABLE
    print(
        f"mscon: no run {args.run_id}: not in {folder} and no node holds it (mscon ls lists runs)",
        file=sys.stderr,
    )
    return exit_codes.USAGE


def _wants_tui(args: argparse.Namespace, command: str) -> bool:
    return command == "attach" and not args.no_tui and sys.stdin.isatty() and sys.stdout.isatty()


async def _attach(attacher: Attacher, args: argparse.Namespace, command: str) -> int:
    loop = asyncio.get_running_loop()
    if attacher.options.interactive:
        from mscon.console.views.tui.launch import run_live

        return await run_live(attacher, args)
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Leaving never stops the run: a second signal leaves at once.
        loop.add_signal_handler(sig, attacher.submit, DetachRun("left the run"))

    def output_closed() -> None:  # from the stdout thread (`mscon logs -f | head`): leave, quietly
        loop.call_soon_threadsafe(attacher.submit, DetachRun("output closed (stdout)"))

    if command == "logs":
        printer = LogPrinter(set(args.rank or ()), output_closed)
        attacher.bus.add_sink(
            "logs", printer.handle, lag_limit=10**9, hard_limit=10**9, busy=lambda: printer.writer.draining
        )
        result = await attacher.run()
        await printer.writer.wait_drained()
        if result.status.value in ("unreachable", "error"):
            print(f"mscon: {printable(result.reason)}", file=sys.stderr)
            return result.exit_code
        return exit_codes.OK
    reporter = HeadlessReporter(json_path=getattr(args, "json", None), on_output_closed=output_closed)
    attacher.bus.add_sink("headless", reporter.handle, busy=reporter.busy)
    result = await attacher.run()
    return result.exit_code


class LogPrinter:
    """``mscon logs``: every replayed and live line, prefixed as ``mscon run`` prefixes them."""

    def __init__(self, ranks: set[int], on_closed: Callable[[], None] | None = None) -> None:
        sys.stdout.flush()
        self.writer = StdoutWriter(sys.stdout.fileno(), on_closed)
        self.ranks = ranks

    def handle(self, event: Event) -> Awaitable[bool] | None:
        if isinstance(event, AgentEvent) and isinstance(event.msg, LogBatch):
            msg = event.msg
            if self.ranks and msg.rank not in self.ranks:
                return
            prefix = f"[{printable(msg.node)} {printable(msg.name)}] ".encode()
            self.writer.write(
                b"".join(prefix + line.encode("utf-8", "replace") + b"\n" for line in msg.lines)
            )
        elif isinstance(event, RunFinished):
            return self.writer.wait_drained()  # awaited by the bus, off the event loop
        return None


def ls_main(args: argparse.Namespace) -> int:
    if args.inventory is None and args.hosts is None and not args.nodes:
        return _ls_history(args)
    if args.inventory is not None and args.hosts is not None:
        return usage_error(f"--hosts replaces an inventory, and {args.inventory} was given as one")
    try:
        if args.hosts is not None:
            flags = AdhocFlags(hosts=args.hosts, nproc_per_node=1)
            inv = adhoc_inventory(flags, Path.cwd(), "", ())  # no job: only the nodes are asked
        else:
            inv = _inventory(args.inventory, None)
    except AdhocError as exc:
        return usage_error(str(exc))
    except InventoryError as exc:
        print(exc.report(), file=sys.stderr)
        return exit_codes.USAGE
    try:
        runs, errors = asyncio.run(_list(inv, args.accept_new_host_keys))
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    for error in errors:
        print(f"mscon: {printable(error)}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_dict() for r in runs], indent=2))
    else:
        print(format_runs(runs, [p.node.name for p in build_plan(inv, inv.job.script, inv.job.args)]))
    return exit_codes.UNREACHABLE if errors and not runs else exit_codes.OK


def _ls_history(args: argparse.Namespace) -> int:
    """``mscon ls`` with no nodes named: the runs this folder's consoles started (console/history)."""
    from mscon.console.history.runs import format_past_runs, past_runs

    runs = past_runs(args.logs_dir)
    if args.json:
        print(json.dumps([r.to_json() for r in runs], indent=2))
    else:
        print(format_past_runs(runs, args.logs_dir))
    return exit_codes.OK


async def _list(inv: Inventory, accept_new: bool) -> tuple[list[RunInfo], list[str]]:
    plans = build_plan(inv, inv.job.script, inv.job.args)
    inbox: asyncio.Queue[object] = asyncio.Queue()
    session = ClusterSession(inv, plans, "ls", lambda ev: None, inbox, accept_new)  # type: ignore[arg-type]
    try:
        return await session.list_runs()
    finally:
        await session.disconnect()


def format_runs(runs: list[RunInfo], order: list[str]) -> str:
    """One row per run: its status (node 0's, which coordinates), attempt, age, where."""
    by_run: dict[str, list[RunInfo]] = {}
    for r in runs:
        by_run.setdefault(r.run_id, []).append(r)
    if not by_run:
        return "no runs on these nodes"
    rank = {n: i for i, n in enumerate(order)}
    rows = [("RUN", "STATUS", "ATTEMPT", "AGE", "NODES", "DETACHED", "")]
    now = time.time()
    for run_id in sorted(by_run, key=lambda k: min(r.started or 0 for r in by_run[k]), reverse=True):
        infos = sorted(by_run[run_id], key=lambda r: rank.get(r.node, len(rank)))
        lead = infos[0]
        statuses = {r.status for r in infos}
        status = lead.status if len(statuses) == 1 or lead.status != "running" else "/".join(sorted(statuses))
        age = _age(now - lead.started) if lead.started else "-"
        rows.append(
            (
                printable(run_id),
                status,
                str(max(r.attempt for r in infos)),
                age,
                ",".join(printable(r.node) for r in infos),
                "yes" if any(r.detached for r in infos) else "no",
                printable(lead.reason)[:60],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
