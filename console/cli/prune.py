"""``mscon prune``: old run folders removed from the nodes (and, with ``--local``, from ./mscon-runs).

Which runs go is agent/retention.py's choice, the same on the nodes and here: all but the newest
``--keep`` (default: the inventory's retention.keep_runs), only those older than ``--older-than``
days when given; never a run that is running or detached.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from pathlib import Path

from mscon.agent import retention
from mscon.agent.layout import LOGS_DIR
from mscon.agent.protocol import PrunedRun
from mscon.console.cli.usage import usage_error
from mscon.console.config.adhoc import AdhocError, AdhocFlags, build_inventory
from mscon.console.config.inventory import Inventory, InventoryError, load_inventory_or_default
from mscon.console.engine import exit_codes
from mscon.console.engine.events import JobState
from mscon.console.engine.plan import build_plan
from mscon.console.engine.session import ClusterSession
from mscon.console.history.runs import past_runs
from mscon.console.transport.base import printable
from mscon.console.views.plain import size

_LIVE = (JobState.RUNNING, JobState.DETACHED)  # a local run folder in one of these is never removed


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "prune",
        help="remove old run folders from the nodes (and ./mscon-runs with --local)",
        description="Remove the nodes' old run folders (logs, checkpoints, the unpacked workdir): all "
        "but each node's newest N runs, never one that is running or detached. Prints what went and "
        "the bytes freed.",
    )
    p.add_argument("inventory", nargs="?", help="inventory YAML (default: the embedded local inventory)")
    p.add_argument("--hosts", metavar="HOST,HOST", help="the nodes, reached as `ssh HOST` reaches them")
    p.add_argument("--python", metavar="PATH", help="the nodes' interpreter (with --hosts; default python3)")
    p.add_argument(
        "--keep",
        type=int,
        metavar="N",
        help="runs kept per node (default: the inventory's retention.keep_runs)",
    )
    p.add_argument("--older-than", type=float, metavar="DAYS", help="only runs started more than DAYS ago")
    p.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    p.add_argument(
        "--local",
        action="store_true",
        help=f"also prune this machine's fetched runs (--logs-dir, ./{LOGS_DIR})",
    )
    p.add_argument(
        "--logs-dir", metavar="DIR", type=Path, default=Path(LOGS_DIR), help="where fetched logs are"
    )
    p.add_argument("--accept-new-host-keys", action="store_true", help="trust and record new host keys")


def _inventory(args: argparse.Namespace) -> Inventory:
    if args.hosts is None:
        return load_inventory_or_default(args.inventory)
    # The nodes only: no job runs, so the workdir and script are placeholders nothing reads.
    return build_inventory(
        AdhocFlags(hosts=args.hosts, nproc_per_node=1, python=args.python), Path.cwd(), "-"
    )


def prune_main(args: argparse.Namespace) -> int:
    if args.keep is not None and not 0 <= args.keep <= 100_000:
        return usage_error(f"--keep: expected 0..100000, got {args.keep}")
    if args.older_than is not None and not args.older_than >= 0:
        return usage_error(f"--older-than: expected a number of days >= 0, got {args.older_than:g}")
    if args.hosts is not None and args.inventory is not None:
        return usage_error("--hosts: give the nodes with an inventory or with --hosts, not both")
    try:
        inv = _inventory(args)
    except (InventoryError, AdhocError) as exc:
        print(str(exc), file=sys.stderr)
        return exit_codes.USAGE
    keep = inv.retention.keep_runs if args.keep is None else args.keep
    if args.keep is None and args.older_than is not None:
        keep = 0  # --older-than alone: every finished run that old
    verb = "would remove" if args.dry_run else "removed"
    try:
        pruned, errors = asyncio.run(
            _prune_nodes(inv, keep, args.older_than, args.dry_run, args.accept_new_host_keys)
        )
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    for error in errors:
        print(f"mscon: {printable(error)}", file=sys.stderr)
    freed = 0
    for r in sorted(pruned, key=lambda r: (r.node, r.run_id)):
        if r.error:
            print(f"{printable(r.node)}: cannot remove {printable(r.run_id)}: {printable(r.error)}")
            continue
        freed += r.bytes
        print(f"{printable(r.node)}: {verb} {printable(r.run_id)} ({size(r.bytes)})")
    if args.local:
        freed += _prune_local(args.logs_dir, keep, args.older_than, args.dry_run, verb)
    nodes = ", ".join(printable(n.name) for n in inv.nodes)
    done = "would free" if args.dry_run else "freed"
    print(f"{done} {size(freed)} (kept the newest {keep} run(s) of each node: {nodes})")
    return exit_codes.UNREACHABLE if errors else exit_codes.OK


async def _prune_nodes(
    inv: Inventory, keep: int, older_than_days: float | None, dry_run: bool, accept_new: bool
) -> tuple[list[PrunedRun], list[str]]:
    plans = build_plan(inv, inv.job.script, inv.job.args)
    inbox: asyncio.Queue[object] = asyncio.Queue()
    session = ClusterSession(inv, plans, "prune", lambda ev: None, inbox, accept_new)  # type: ignore[arg-type]
    try:
        return await session.prune_runs(keep, older_than_days, dry_run)
    finally:
        await session.disconnect()


def _prune_local(logs_root: Path, keep: int, older_than_days: float | None, dry_run: bool, verb: str) -> int:
    """This machine's fetched runs (console/history/runs.py reads them); the bytes freed."""
    runs = {r.run_id: r for r in past_runs(logs_root)}
    candidates = [
        retention.Candidate(r.run_id, r.started or 0.0, r.status in _LIVE, str(r.folder))
        for r in runs.values()
    ]
    older = None if older_than_days is None else older_than_days * retention.DAY_S
    freed = 0
    for c in retention.choose(candidates, keep, older):
        run = runs[c.key]
        if not dry_run:
            shutil.rmtree(run.folder, ignore_errors=True)
        freed += run.size
        print(f"local: {verb} {printable(run.folder.as_posix())} ({size(run.size)})")
    return freed
