"""Every use of a Textual private attribute, in one place.

mscon needs two things Textual has no public API for: the running app's driver (to ask it whether
frames were dropped, ``App._driver``), and the queue between the Linux driver and its writer thread
(to drop a frame instead of blocking the event loop when the terminal stops reading,
``LinuxDriver._writer_thread._queue``; see terminal.py). pyproject.toml pins the Textual versions
this was tested with; ``problems()`` says, naming the attribute and the installed version, what an
upgrade broke (tests/tui/test_textual_compat.py runs it).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import io
import queue
from typing import Any

from textual.app import App
from textual.driver import Driver

TEXTUAL_VERSION = importlib.metadata.version("textual")


def app_driver(app: App[Any]) -> Driver | None:
    """The driver a running app writes through (None before it runs)."""
    return app._driver


def writer_queue(driver: Driver) -> queue.Queue[str | None] | None:
    """The bounded queue of output between a LinuxDriver and its writer thread (None outside
    application mode, when there is no writer thread)."""
    writer = driver._writer_thread  # type: ignore[attr-defined]
    return None if writer is None else writer._queue


def problems() -> list[str]:
    """One line per private attribute above that the installed Textual no longer has (none: all
    is well). Builds an app and a Linux driver, without starting either (no terminal is touched)."""
    found: list[str] = []

    def missing(what: str, use: str) -> None:
        found.append(
            f"textual {TEXTUAL_VERSION}: {what} is gone ({use}); update console/views/tui/textual_compat.py "
            "or keep Textual in the range pinned in pyproject.toml"
        )

    async def probe() -> None:
        app: App[Any] = App()
        if not hasattr(app, "_driver"):
            missing("App._driver", "the live view asks its driver for dropped frames")
        try:
            from textual.drivers import linux_driver
            from textual.drivers._writer_thread import WriterThread
        except ImportError as exc:
            missing(f"module {exc.name}", "the non-blocking driver extends the Linux driver")
            return
        driver = linux_driver.LinuxDriver(app)
        if not hasattr(driver, "_writer_thread"):
            missing("LinuxDriver._writer_thread", "frames go through its queue without blocking")
        if getattr(linux_driver, "WriterThread", None) is not WriterThread:
            missing("the Linux driver's use of _writer_thread.WriterThread", "its queue is the one filled")
        writer = WriterThread(io.StringIO())
        q = getattr(writer, "_queue", None)
        if not isinstance(q, queue.Queue) or q.maxsize <= 0:
            missing("WriterThread._queue (a bounded queue.Queue)", "a full queue drops a frame")

    asyncio.run(probe())
    return found
