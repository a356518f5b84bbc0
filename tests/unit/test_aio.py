"""Ending tasks without swallowing the caller's own cancellation (console/engine/aio.py, and its use in the
session's close, release and request)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mscon.agent.protocol import Ping, Resolved
from mscon.console.engine.aio import cancel_and_wait, wait_or_cancel
from mscon.console.engine.session import ClusterSession, NodeLink


async def _slow_to_stop(stopping: asyncio.Event, release: asyncio.Event) -> None:
    """A task that, once cancelled, needs a moment to clean up (as a reader closing its channel)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        stopping.set()
        await release.wait()
        raise


async def _cancel_once(task: asyncio.Task[Any], when: asyncio.Event) -> None:
    await when.wait()
    task.cancel()


async def test_cancel_and_wait_absorbs_the_tasks_own_cancellation() -> None:
    task = asyncio.ensure_future(asyncio.Event().wait())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_cancel_and_wait_lets_the_callers_cancellation_through() -> None:
    stopping, release = asyncio.Event(), asyncio.Event()
    child = asyncio.ensure_future(_slow_to_stop(stopping, release))
    await asyncio.sleep(0)
    caller = asyncio.ensure_future(cancel_and_wait(child))
    canceller = asyncio.ensure_future(_cancel_once(caller, stopping))
    await canceller
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert child.cancelled()


async def test_cleanup_after_a_cancellation_still_runs_to_its_end() -> None:
    """In the ``except CancelledError`` (or ``finally``) of a task being cancelled, ending a child
    does not re-raise there: the cleanup goes on, then the task's own cancellation propagates."""
    steps: list[str] = []

    async def owner() -> None:
        child = asyncio.ensure_future(asyncio.Event().wait())
        try:
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(child)
            steps.append("child ended")
            await wait_or_cancel(asyncio.ensure_future(asyncio.sleep(0)), 1.0)
            steps.append("cleanup done")

    task = asyncio.ensure_future(owner())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["child ended", "cleanup done"]


async def test_wait_or_cancel() -> None:
    assert await wait_or_cancel(asyncio.ensure_future(asyncio.sleep(0)), 5.0)
    never = asyncio.ensure_future(asyncio.Event().wait())
    assert not await wait_or_cancel(never, 0.01)
    assert never.cancelled()

    stopping, release = asyncio.Event(), asyncio.Event()
    child = asyncio.ensure_future(_slow_to_stop(stopping, release))
    caller = asyncio.ensure_future(wait_or_cancel(child, 30.0))
    await asyncio.sleep(0)
    child.cancel()  # someone else ends it: no error for the caller
    release.set()
    assert not await caller

    gate = asyncio.Event()
    child = asyncio.ensure_future(asyncio.Event().wait())
    caller = asyncio.ensure_future(wait_or_cancel(child, 30.0))
    canceller = asyncio.ensure_future(_cancel_once(caller, gate))
    await asyncio.sleep(0)
    gate.set()
    await canceller
    with pytest.raises(asyncio.CancelledError):
        await caller


class _Channel:
    def __init__(self) -> None:
        self.sent = asyncio.Event()

    async def send(self, msg: object) -> None:
        self.sent.set()


def _session() -> tuple[ClusterSession, NodeLink, _Channel]:
    session = ClusterSession.__new__(ClusterSession)  # only the links: no inventory, no transport
    channel = _Channel()
    link = NodeLink(plan=None, transport=None, channel=channel, open=True)  # type: ignore[arg-type]
    session.links = {"a": link}
    return session, link, channel


async def test_a_request_cancelled_by_its_caller_raises_instead_of_answering() -> None:
    session, link, channel = _session()
    caller = asyncio.ensure_future(session.request("a", Ping(), Resolved, 30.0))
    canceller = asyncio.ensure_future(_cancel_once(caller, channel.sent))
    await canceller
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert not link.waiters


async def test_a_request_whose_channel_ends_gets_a_one_line_answer() -> None:
    session, link, channel = _session()
    caller = asyncio.ensure_future(session.request("a", Ping(), Resolved, 30.0))
    await channel.sent.wait()
    link.waiters["resolved"].cancel()  # what the reader does when the channel ends
    assert await caller == "no answer from the agent in 30 s"


async def test_closing_a_link_ends_its_reader_and_keeps_the_callers_cancellation() -> None:
    session, link, _ = _session()
    link.channel = None
    stopping, release = asyncio.Event(), asyncio.Event()
    link.reader = asyncio.ensure_future(_slow_to_stop(stopping, release))
    await asyncio.sleep(0)
    closer = asyncio.ensure_future(session._close_link(link, 1.0))
    canceller = asyncio.ensure_future(_cancel_once(closer, stopping))
    await canceller
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert link.reader.cancelled()
