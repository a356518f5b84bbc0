"""``mscon validate INVENTORY...``: check inventories without connecting anywhere.

One line per file: ``ok: PATH (N nodes, W ranks)`` on ``out`` for a good one; for a bad one, every
error the loader found in it, one line each, on ``err``, or the one thing ``mscon run`` would refuse
before connecting (console/cli/prerun.py: the same function). Exit status 0 when every file is good,
else 2.
"""

from __future__ import annotations

import sys
from typing import TextIO

from mscon.console.cli.prerun import refused_before_connecting
from mscon.console.config.inventory import InventoryError, load_inventory, oneline
from mscon.console.engine import exit_codes


def validate_main(paths: list[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Validate each inventory; never raises (short of KeyboardInterrupt)."""
    # Looked up per call, not bound at import, so redirected or captured streams are honoured.
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if not paths:
        _emit(err, "mscon validate: give at least one inventory file")
        return exit_codes.USAGE
    status = exit_codes.OK
    for path in paths:
        try:
            inv = load_inventory(path)
        except InventoryError as exc:
            for line in exc.lines():  # every error of the file, found in one pass
                _emit(err, line)
            status = exit_codes.USAGE
            continue
        except Exception as exc:  # a loader bug must still be one line and exit 2
            _emit(err, f"{oneline(str(path))}: internal error: {oneline(f'{type(exc).__name__}: {exc}')}")
            status = exit_codes.USAGE
            continue
        refused = refused_before_connecting(inv)
        if refused is not None:
            _emit(err, f"{oneline(str(path))}: {oneline(refused)}")
            status = exit_codes.USAGE
            continue
        if inv.slurm is not None and not inv.nodes:
            _emit(out, f"ok: {oneline(str(path))} (nodes from the Slurm allocation)")
            continue
        nodes, ranks = len(inv.nodes), inv.world_size
        _emit(out, f"ok: {oneline(str(path))} ({_count(nodes, 'node')}, {_count(ranks, 'rank')})")
    return status


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _emit(stream: TextIO, line: str) -> None:
    """Write one line; a stream that cannot encode it gets escapes, a closed one gets nothing."""
    try:
        try:
            stream.write(line + "\n")
        except UnicodeEncodeError:
            stream.write(line.encode("ascii", "backslashreplace").decode("ascii") + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass
