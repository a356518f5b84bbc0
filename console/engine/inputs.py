"""The supervisor's one input queue: commands first, then clock ticks, then the agents' messages.

A failure an agent reports also jumps the queue as an ``Alarm``, so the stop goes out at once and
not after the log batches queued ahead of it; the message itself still follows in order. MindSpore's
own word on which rank failed (``Evidence``) jumps the queue too, in its place among the alarms: an
agent sends a process's last lines before its exit, so the scheduler's blame line that came before a
rank's failure is weighed before the stop, not dropped as something said while stopping.

The agents' messages waiting here are bounded (``AGENT_BACKLOG``): past it a sample (a summary,
metrics, telemetry: the next supersedes it) is dropped, and a reader with any other message waits,
its channel backs up, and the agent keeps its lines in their files until the console has caught up
(agent/outbox.py). An alarm never waits. A console short of CPU so falls behind in what it shows,
never in memory nor in its stop (issue 44).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from mscon.agent.protocol import Evidence, Message, ProcExited, ProcHung
from mscon.console.engine.aio import cancel_and_wait, cancels, raise_if_cancelled_since
from mscon.console.engine.clock import Clock, MonotonicClock
from mscon.console.engine.commands import Command, DetachRun, RestartGroup, StopJob

T = TypeVar("T")

AGENT_BACKLOG = 1_000  # agent messages queued before samples are dropped (well under a second of work)
_YIELD_EVERY = 64  # items taken in a row before the readers get a turn (an alarm may be waiting there)


class Tick:
    pass


TICK = Tick()


@dataclass(frozen=True, slots=True)
class Alarm:
    """A failure seen by a channel's reader: it jumps the queue so the stop goes out at once, not
    after the log batches queued ahead of it (at 1,000 nodes, seconds of them). The message itself
    still follows in order, for the state and the views."""

    node: str
    msg: ProcExited | ProcHung


def alarming(msg: Message | None) -> bool:
    return (isinstance(msg, ProcExited) and not msg.ok and not msg.stopped_by_agent) or isinstance(
        msg, ProcHung
    )


Input = Command | Tick | Alarm | tuple[str, Message | None]


class Inputs:
    """Everything the supervisor reacts to, in one queue: commands first, then ticks, then agents."""

    def __init__(self, clock: Clock | None = None, backlog: int = AGENT_BACKLOG) -> None:
        self.clock: Clock = clock or MonotonicClock()  # what ``serve_while``'s limit is measured on
        self._q: asyncio.PriorityQueue[tuple[int, int, Input]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self.tick_pending = False
        self.backlog = backlog
        self._agent_items = 0  # (node, message) items queued
        self.dropped = 0  # samples dropped while behind (each superseded by the next)
        self._gets = 0
        self._room = asyncio.Event()
        self._room.set()

    def put_nowait(self, item: Input) -> None:
        """Queue at once, whatever the backlog (a lost channel, an item put back)."""
        if isinstance(item, tuple):
            node, msg = item
            if self._jump(node, msg):
                self._in_order(item)
            return
        prio = 0 if isinstance(item, StopJob | RestartGroup | DetachRun | Alarm) else 1
        self._q.put_nowait((prio, next(self._seq), item))

    def _jump(self, node: str, msg: Message | None) -> bool:
        """Queue what of ``msg`` jumps the queue: a failure's Alarm, or MindSpore's blame itself.
        False when the message itself went (it has no place in order left to take)."""
        if isinstance(msg, Evidence):
            self._count_agent_item()
            self._q.put_nowait((0, next(self._seq), (node, msg)))
            return False
        if alarming(msg):
            assert isinstance(msg, ProcExited | ProcHung)
            self._q.put_nowait((0, next(self._seq), Alarm(node, msg)))
        return True

    def _in_order(self, item: tuple[str, Message | None]) -> None:
        self._count_agent_item()
        self._q.put_nowait((2, next(self._seq), item))

    def _count_agent_item(self) -> None:
        self._agent_items += 1
        if self._agent_items >= self.backlog:
            self._room.clear()

    async def put_all(self, node: str, msgs: list[Message]) -> None:
        """A channel's messages as its reader found them buffered together: whatever of them jumps
        the queue goes in at once, before the reader waits for room with the rest (an exit
        behind a backlog of log batches in the same read is not held up by them: issue 44);
        the rest as ``put`` takes them, in order."""
        if not any(m.alarm for m in msgs):  # the usual case: nothing to hand on first
            for msg in msgs:
                await self.put((node, msg))
            return
        for msg in [m for m in msgs if self._jump(node, m)]:
            await self._put_in_order((node, msg))

    async def put(self, item: Input) -> None:
        """Queue; past ``backlog`` queued agent messages, a sample the next one supersedes (a
        NodeSummary, metrics, telemetry) is dropped and counted, and any other message waits (its
        reader with it), but for an alarm: a reader never holds back an exit or a hang."""
        if not isinstance(item, tuple):
            self.put_nowait(item)
        elif not alarming(item[1]):
            await self._put_in_order(item)
        elif self._jump(*item):
            self._in_order(item)

    async def room_for(self, sampled: bool) -> bool:
        """Whether a message may go in: at once below ``backlog``; past it False for a sample
        (dropped, counted), and True for any other once there is room. A reader asks before it
        decodes, so a console behind decodes no sample it drops."""
        if self._agent_items < self.backlog:
            return True
        if sampled:
            self.dropped += 1
            return False
        # Once, not in a loop: the room opens at half the bound and lets every reader waiting
        # in (a reader per node at most past it). Re-checking would wake all of them at every
        # message taken: quadratic at 10,000 nodes.
        await self._room.wait()
        return True

    async def _put_in_order(self, item: tuple[str, Message | None]) -> None:
        """``item``'s place in order, once there is room (its jump, if any, already queued); an
        alarm never waits."""
        msg = item[1]
        if not alarming(msg) and not await self.room_for(msg is not None and msg.sampled):
            return
        if isinstance(msg, Evidence):
            self._jump(*item)  # blame goes in as its own jump
        else:
            self._in_order(item)

    async def get(self) -> Input:
        self._gets += 1
        if self._gets % _YIELD_EVERY == 0:
            # A queue that is never empty never suspends its taker: without this the channels'
            # readers, one of which may hold an exit, would wait until the whole backlog is done.
            await asyncio.sleep(0)
        return self._taken((await self._q.get())[2])

    def get_nowait(self) -> Input:
        return self._taken(self._q.get_nowait()[2])

    @property
    def queued(self) -> int:
        """Agent messages waiting (how far behind the console is)."""
        return self._agent_items

    def _taken(self, item: Input) -> Input:
        if isinstance(item, tuple):
            self._agent_items -= 1
            if self._agent_items <= self.backlog // 2 and not self._room.is_set():
                self._room.set()
        return item

    def empty(self) -> bool:
        return self._q.empty()

    async def serve_while(
        self, aw: Awaitable[T], take: Callable[[Input], bool], limit_s: float | None = None
    ) -> T | None:
        """Await ``aw`` while handing every input that comes to ``take`` (True: stop waiting); its
        result, or None when ``take`` (or ``limit_s``) ended the wait first (``aw`` is cancelled)."""
        task = asyncio.ensure_future(aw)
        deadline = None if limit_s is None else self.clock.now() + limit_s
        while not task.done():
            getter = asyncio.ensure_future(self.get())
            left = None if deadline is None else max(0.0, deadline - self.clock.now())
            await self.clock.wait_first({task, getter}, left)
            if not getter.done():
                before = cancels()
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
                raise_if_cancelled_since(before)  # our caller's own cancellation is not swallowed
                if not getter.cancelled():  # it got an item while being cancelled: keep it
                    self.put_nowait(getter.result())
                if not task.done():  # timed out
                    break
                continue
            if take(getter.result()):
                break
        if task.done():
            return task.result()
        with contextlib.suppress(Exception):
            await cancel_and_wait(task)
        return None
