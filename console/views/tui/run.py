"""Run the console app around a source, and make sure a live run is stopped whatever the app does."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

from mscon.console.engine.commands import StopJob
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.source import Source


async def run_console(source: Source, **options: Any) -> int:
    """The run's exit code (live), or 0 (replay). SIGTERM stops the run and then quits; an app that
    ends for any reason while the run goes on stops it (the engine is never left behind)."""
    app = MsconApp(source, **options)
    loop = asyncio.get_running_loop()

    def terminated() -> None:
        app.exit_when_done = True
        source.submit(StopJob("terminated (SIGTERM)"))
        if not source.accepts_commands:
            app.exit(0)

    loop.add_signal_handler(signal.SIGTERM, terminated)
    try:
        code = await app.run_async()
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGTERM)
        final = await source.finish()
    if source.live:
        return final
    return code or 0
