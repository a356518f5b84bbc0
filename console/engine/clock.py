"""The engine's time, given to it: every run rule the supervisor hosts (the policy's ``now``, the
ticks that drive its deadlines: linger, stop confirmation, backoff, the operator's wait; the adopt
wait; the input loop's deadlines) reads this clock and waits on it, never ``time.monotonic()`` or
``asyncio.sleep`` directly.

``MonotonicClock`` is the real one (the default). ``FakeClock`` is for tests: its time moves only
when the test says so (``advance``, ``advance_to``) or, with ``run_until``, whenever the event loop
has nothing left to do but wait on it, so a test of a timing rule jumps past a backoff instead of
sleeping through it or shrinking the constant.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from mscon.console.engine.aio import cancel_and_wait

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait_for(self, aw: Awaitable[T], timeout_s: float) -> T:
        """``aw``'s result, or TimeoutError (``aw`` cancelled) once ``timeout_s`` passed."""
        ...

    async def wait_first(self, futures: Iterable[asyncio.Future[Any]], timeout_s: float | None) -> None:
        """Until one of ``futures`` is done or ``timeout_s`` passed (None: no limit); none is cancelled."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic()`` and the event loop's own timers."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, aw: Awaitable[T], timeout_s: float) -> T:
        return await asyncio.wait_for(aw, timeout_s)

    async def wait_first(self, futures: Iterable[asyncio.Future[Any]], timeout_s: float | None) -> None:
        await asyncio.wait(set(futures), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)


async def settle(max_rounds: int = 10_000) -> None:
    """Let the event loop run until nothing is ready to run (every task waits on something): the
    effects of what just happened have all been carried out."""
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)  # asyncio's own loop; another loop: a fixed number of rounds
    quiet = 0
    for _ in range(max_rounds):
        await asyncio.sleep(0)
        if ready is None:
            quiet += 1
            if quiet >= 100:
                return
        elif len(ready) == 0:
            quiet += 1
            if quiet >= 3:
                return
        else:
            quiet = 0


class FakeClock:
    """A clock for tests: time stands still until the test moves it. ``advance`` wakes each sleeper
    at its own deadline, in order, and lets the loop settle after each (so a ticker that sleeps
    again at once is woken again within the same advance, as a real one would be)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    @property
    def sleepers(self) -> int:
        """How many tasks wait on this clock now."""
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    def next_deadline(self) -> float | None:
        """When the first sleeper wakes; None when nobody waits on the clock."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)  # cancelled while asleep
        return self._sleepers[0][0] if self._sleepers else None

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()

    async def wait_for(self, aw: Awaitable[T], timeout_s: float) -> T:
        task = asyncio.ensure_future(aw)
        timer = asyncio.ensure_future(self.sleep(timeout_s))
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # our caller's cancellation: what it waited on goes too
            task.cancel()
            raise
        finally:
            if not timer.done():
                await cancel_and_wait(timer)
        if task.done():
            return task.result()
        await cancel_and_wait(task)
        raise TimeoutError

    async def wait_first(self, futures: Iterable[asyncio.Future[Any]], timeout_s: float | None) -> None:
        waiting = set(futures)
        if timeout_s is None:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            return
        timer = asyncio.ensure_future(self.sleep(timeout_s))
        try:
            await asyncio.wait({*waiting, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not timer.done():
                await cancel_and_wait(timer)

    # -------------------------------------------------------------- the test's controls

    async def advance(self, seconds: float) -> None:
        """Move time ``seconds`` on: every sleeper whose deadline comes is woken, in order."""
        assert seconds >= 0, "time does not go back"
        await self.advance_to(self._now + seconds)

    async def advance_to(self, when: float) -> None:
        await settle()  # what was already under way first, at the time it happened
        while (first := self.next_deadline()) is not None and first <= when:
            deadline, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            fut.set_result(None)
            await settle()
        self._now = max(self._now, when)
        await settle()

    async def run_until(self, cond: Callable[[], bool], limit_s: float) -> float:
        """Let the loop settle, and while ``cond()`` is false jump to the next sleeper's deadline
        (time moves only when every task is waiting); how far time moved. AssertionError when it
        would take more than ``limit_s``, or nobody waits on the clock."""
        start = self._now
        await settle()
        while not cond():
            first = self.next_deadline()
            assert first is not None, "nothing waits on the clock and the condition is not met"
            assert first - start <= limit_s, f"condition not met within {limit_s:g} s of clock time"
            await self.advance_to(first)
        return self._now - start
