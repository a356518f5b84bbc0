"""The console's entry points for the CLI: a live run in the TUI, and a replay of a recording."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mscon.console.detach.attach import Attacher
from mscon.console.engine import exit_codes
from mscon.console.engine.events import Event
from mscon.console.engine.summary import write_summary
from mscon.console.engine.supervisor import Supervisor
from mscon.console.history.recording import RunRecorders, read_recording
from mscon.console.history.runs import NoRecording, find_recording
from mscon.console.views.headless.reporter import format_summary
from mscon.console.views.plain import printable
from mscon.console.views.tui.run import run_console
from mscon.console.views.tui.source import LiveSource, ReplaySource


def is_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


async def run_live(sup: Supervisor | Attacher, args: argparse.Namespace) -> int:
    """``mscon up`` / ``mscon run`` at a terminal: the supervisor and the console in one loop."""
    # A run this console starts keeps its recording in its folder; an attached one has it already.
    history = sup.logs_dir if isinstance(sup, Supervisor) else None
    recorder = RunRecorders(sup.bus, history, getattr(args, "events", None))
    source = LiveSource(sup)
    try:
        code = await run_console(source)  # stragglers: the engine's (RunOptions.straggler_*)
    finally:
        recorder.close()
    result = source.result
    if result is not None:
        sys.stderr.write(format_summary(result))
        json_path = getattr(args, "json", None)
        if json_path is not None:
            try:
                write_summary(json_path, result)
            except OSError as exc:
                sys.stderr.write(f"mscon: cannot write {json_path}: {exc.strerror or exc}\n")
    return code


async def _replay(events: list[Event], speed: float) -> int:
    return await run_console(ReplaySource(events, speed=speed))


def replay_main(target: str, logs_root: Path, speed: float) -> int:
    """``mscon replay RUN_ID|EVENTS.jsonl``: a past run's recording (its run folder's under
    ``logs_root``) or an ``--events`` file in the console, at ``speed``."""
    import asyncio

    if speed < 0:
        print("mscon: --speed: expected 0 (as fast as possible) or more", file=sys.stderr)
        return exit_codes.USAGE
    try:
        path = find_recording(target, logs_root)
    except NoRecording as exc:
        print(f"mscon: {printable(str(exc))}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        events = list(read_recording(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"mscon: {path}: not a recording of console events ({exc})", file=sys.stderr)
        return exit_codes.USAGE
    if not is_terminal():
        print("mscon: mscon replay needs a terminal", file=sys.stderr)
        return exit_codes.USAGE
    return asyncio.run(_replay(events, speed))
