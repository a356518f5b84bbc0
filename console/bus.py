"""Fan-out of engine events to subscribers, each with its own queue.

A slow subscriber (a busy TUI) must never stall supervision: publishing never blocks. Metrics
and telemetry are dropped for a subscriber that has fallen far behind; lifecycle events and log
lines are never dropped.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

from mscon.agent.protocol import Metric, Telemetry

from .events import AnyEvent

_DROPPABLE = (Metric, Telemetry)


class Subscription:
    def __init__(self, lag_limit: int) -> None:
        self._items: collections.deque[AnyEvent | None] = collections.deque()
        self._ready = asyncio.Event()
        self.lag_limit = lag_limit
        self.dropped = 0

    def _put(self, event: AnyEvent | None) -> None:
        if event is not None and isinstance(event, _DROPPABLE) and len(self._items) >= self.lag_limit:
            self.dropped += 1
            return
        self._items.append(event)
        self._ready.set()

    async def __aiter__(self) -> AsyncIterator[AnyEvent]:
        while True:
            while not self._items:
                self._ready.clear()
                await self._ready.wait()
            event = self._items.popleft()
            if event is None:
                return
            yield event


class EventBus:
    def __init__(self) -> None:
        self._subs: list[Subscription] = []

    def subscribe(self, lag_limit: int = 10_000) -> Subscription:
        sub = Subscription(lag_limit)
        self._subs.append(sub)
        return sub

    def publish(self, event: AnyEvent) -> None:
        for sub in self._subs:
            sub._put(event)

    def close(self) -> None:
        """Ends every subscription's iteration after what is queued."""
        for sub in self._subs:
            sub._put(None)
