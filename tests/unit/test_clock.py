"""The engine's clock (console/engine/clock.py): the fake one moves only when told, wakes each
sleeper at its own deadline and in order, and its waits time out on its time, not the wall's."""

from __future__ import annotations

import asyncio
import time

import pytest
from mscon.console.engine.clock import FakeClock, MonotonicClock, settle


async def test_time_stands_still_until_the_test_moves_it() -> None:
    clock = FakeClock(start=100.0)
    sleeper = asyncio.ensure_future(clock.sleep(5.0))
    await settle()
    await asyncio.sleep(0.02)  # real time passes: the fake clock's does not
    assert clock.now() == 100.0 and not sleeper.done() and clock.sleepers == 1
    await clock.advance(4.99)
    assert not sleeper.done() and clock.now() == pytest.approx(104.99)
    await clock.advance(0.01)
    assert sleeper.done() and clock.now() == pytest.approx(105.0) and clock.sleepers == 0


async def test_a_ticker_that_sleeps_again_wakes_at_each_of_its_deadlines_within_one_advance() -> None:
    clock = FakeClock(start=0.0)
    seen: list[tuple[str, float]] = []

    async def ticker(name: str, period: float) -> None:
        while True:
            await clock.sleep(period)
            seen.append((name, clock.now()))

    tasks = [asyncio.ensure_future(ticker("fast", 0.25)), asyncio.ensure_future(ticker("slow", 0.4))]
    await clock.advance(1.0)
    assert seen == [
        ("fast", 0.25),
        ("slow", 0.4),
        ("fast", 0.5),
        ("fast", 0.75),
        ("slow", 0.8),
        ("fast", 1.0),
    ]
    assert clock.now() == 1.0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert clock.next_deadline() is None  # a cancelled sleeper no longer counts


async def test_wait_for_times_out_on_the_clock_and_cancels_what_it_waited_on() -> None:
    clock = FakeClock()
    never = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(clock.wait_for(never, 30.0))
    await clock.advance(29.9)
    assert not waiting.done()
    await clock.advance(0.1)
    assert waiting.done() and isinstance(waiting.exception(), TimeoutError)
    assert never.cancelled()


async def test_wait_for_returns_what_came_in_time() -> None:
    clock = FakeClock()
    q: asyncio.Queue[str] = asyncio.Queue()
    waiting = asyncio.ensure_future(clock.wait_for(q.get(), 30.0))
    await clock.advance(10.0)
    q.put_nowait("item")
    await settle()
    assert waiting.result() == "item" and clock.sleepers == 0
    q.put_nowait("ready")  # already there: taken even with no time left
    assert await clock.wait_for(q.get(), 0.0) == "ready"


async def test_wait_first_ends_on_a_done_future_or_the_deadline_and_cancels_none() -> None:
    clock = FakeClock()
    a = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(clock.wait_first({a}, 2.0))
    await clock.advance(1.0)
    assert not waiting.done()
    await clock.advance(1.0)
    assert waiting.done() and not a.done()
    waiting = asyncio.ensure_future(clock.wait_first({a}, None))
    await clock.advance(3600.0)
    assert not waiting.done()
    a.set_result(1)
    await settle()
    assert waiting.done() and clock.sleepers == 0


async def test_run_until_moves_time_only_to_the_next_deadline_when_everything_waits() -> None:
    clock = FakeClock(start=0.0)
    steps: list[float] = []

    async def backoff_then_work() -> None:
        await clock.sleep(10.0)
        steps.append(clock.now())
        await asyncio.sleep(0)  # work that takes no clock time
        await clock.sleep(5.0)
        steps.append(clock.now())

    task = asyncio.ensure_future(backoff_then_work())
    moved = await clock.run_until(lambda: len(steps) == 2, limit_s=60.0)
    assert (steps, moved) == ([10.0, 15.0], 15.0)
    await task
    with pytest.raises(AssertionError, match="nothing waits on the clock"):
        await clock.run_until(lambda: False, limit_s=60.0)
    far = asyncio.ensure_future(clock.sleep(100.0))
    with pytest.raises(AssertionError, match="within 60 s"):
        await clock.run_until(lambda: False, limit_s=60.0)
    assert clock.now() == 15.0  # it did not jump past the limit
    far.cancel()


async def test_the_real_clock_is_monotonic_time_and_the_loops_timers() -> None:
    clock = MonotonicClock()
    before, mono = clock.now(), time.monotonic()
    assert abs(before - mono) < 0.5
    await clock.sleep(0.01)
    assert clock.now() > before
    with pytest.raises(TimeoutError):
        await clock.wait_for(asyncio.get_running_loop().create_future(), 0.01)
    assert await clock.wait_for(asyncio.sleep(0, "x"), 1.0) == "x"
