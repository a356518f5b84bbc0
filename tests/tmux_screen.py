"""A program in a real terminal (tmux): read its screen, wait for what it shows, type into it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def capture(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=False
    ).stdout


def keys(session: str, *keys: str) -> None:
    subprocess.run(["tmux", "send-keys", "-t", session, *keys], check=True)


def wait_for(session: str, cond: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``cond`` until it returns something true; on time-out the screen is in the error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; screen:\n{capture(session)}")


def wait_screen(session: str, cond: Callable[[str], bool], timeout: float, what: str) -> str:
    """Wait until the screen satisfies ``cond``; returns that screen."""
    box: list[str] = []

    def seen() -> bool:
        box[:] = [capture(session)]
        return cond(box[0])

    wait_for(session, seen, timeout, what)
    return box[0]
