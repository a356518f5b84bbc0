"""Ending a task without swallowing the caller's own cancellation.

``with suppress(BaseException): await task`` (or ``suppress(CancelledError)``) after ``task.cancel()``
also swallows a cancellation aimed at the task that awaits: Ctrl-C, a ``wait_for`` deadline or a
TaskGroup abort would be lost there and the caller would run on. The rule here: the awaited task's
own CancelledError is absorbed; if the caller was cancelled while it waited (its ``cancelling()``
count went up), the CancelledError is raised on.
"""

from __future__ import annotations

import asyncio
from typing import Any


def cancels() -> int:
    """How many cancellations the running task has been asked for so far (0 outside a task)."""
    me = asyncio.current_task()
    return me.cancelling() if me is not None else 0


def raise_if_cancelled_since(before: int) -> None:
    """Raise CancelledError if the running task was asked to cancel since ``before = cancels()``."""
    if cancels() > before:
        raise asyncio.CancelledError


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended. Its own exception, if any, propagates."""
    before = cancels()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        raise_if_cancelled_since(before)
        return
    raise_if_cancelled_since(before)  # we were cancelled while a task that ignores cancel ran on


async def wait_or_cancel(task: asyncio.Future[Any], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``task`` to end, then cancel it and wait for that; True when it
    ended on its own. Its own exception, if any, propagates."""
    before = cancels()
    try:
        await asyncio.wait_for(task, timeout_s)
    except TimeoutError:  # wait_for has cancelled it and waited for it
        raise_if_cancelled_since(before)
        return False
    except asyncio.CancelledError:
        raise_if_cancelled_since(before)
        return False  # someone else cancelled it
    return True
