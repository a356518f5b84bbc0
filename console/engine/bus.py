"""Fan-out of console events to sinks that cannot hurt the run.

Publishing never blocks and never raises. Each sink has its own bounded queue and its own task:
- metric and telemetry updates are dropped for a sink that lags (counted, reported at the end);
- log batches and lifecycle events are kept, but a sink that falls ``hard_limit`` events behind,
  or whose handler raises, is detached with a Notice and the run goes on (mitmproxy's
  ``safecall`` idea). Logs are never lost for good: they are on the nodes and fetched at the end.
  The traceback of a handler that raised goes to ``console.err`` in the run folder (``errors_to``).

Alarms first (issue 44): a failure (an agent's alarm message: an exit, a hang, blame, its own error),
a lost node and the console's Stopping go ahead of the agents' bulk output (log batches, metrics,
summaries, telemetry) queued for a sink that is ``JUMP_PAST`` or more events behind; never ahead of
another lifecycle event, so each sink still sees those in the order they happened. A sink that keeps
up sees everything in order (a rank's last lines before its failure).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from mscon.console.engine.events import AgentEvent, Event, NodeState, NodeUpdate, Notice, Stopping
from mscon.console.transport.private_copy import private_text

Handler = Callable[[Event], None | Awaitable[None]]
CONSOLE_ERR = "console.err"  # in the run folder: the tracebacks of views (sinks) that raised
# Bulk events queued for a sink before an alarm goes ahead of them (a few milliseconds of a view's
# work: below it, the order as it happened is worth more than the wait).
JUMP_PAST = 256


def _droppable(ev: Event) -> bool:
    return isinstance(ev, AgentEvent) and ev.msg.sampled


def _bulk(ev: Event | None) -> bool:
    """The agents' streamed output: what an alarm may overtake."""
    return isinstance(ev, AgentEvent) and ev.msg.streamed


def alarm_event(ev: Event) -> bool:
    """What the operator must see ahead of a backlog of output: an agent's alarm (the message's
    own flag, as its outbox lanes it), a node lost or unreachable, the console stopping the run."""
    if isinstance(ev, AgentEvent):
        return ev.msg.alarm
    if isinstance(ev, NodeUpdate):
        return ev.state in (NodeState.LOST, NodeState.UNREACHABLE)
    return isinstance(ev, Stopping)


class Subscription:
    def __init__(
        self,
        name: str,
        lag_limit: int,
        hard_limit: int,
        busy: Callable[[], bool] | None = None,
        alarms_first: bool | None = None,
    ) -> None:
        self.name = name
        # A view that may skip samples while behind sees alarms first too; a sink that takes every
        # event (a recording: lag_limit = hard_limit) keeps the order they happened in.
        self.alarms_first = lag_limit < hard_limit if alarms_first is None else alarms_first
        # True while the sink works through a bounded job of its own (a reporter draining stdout
        # with its own stall rule): the bus's close then does not take it for a stuck sink.
        self.busy = busy or (lambda: False)
        self._items: collections.deque[Event | None] = collections.deque()
        # Alarms ahead of the bulk, each with the count of other events that must go before it.
        self._alarms: collections.deque[tuple[Event, int]] = collections.deque()
        self._bulk = 0  # bulk events in _items
        self._others_in = 0  # events other than bulk ones put in _items so far (the end included)
        self._others_out = 0  # and taken
        self._ready = asyncio.Event()
        self.lag_limit = lag_limit
        self.hard_limit = hard_limit
        self.dropped = 0
        self.taken = 0  # events handed to the consumer (a drain that stalls is a stuck sink)
        self.detached: str | None = None  # why it stopped receiving

    def put(self, event: Event | None) -> bool:
        """Queue an event; False when this sink must be detached (too far behind)."""
        if self.detached is not None:
            return True
        queued = len(self._items) + len(self._alarms)
        if event is not None and queued >= self.lag_limit and _droppable(event):
            self.dropped += 1
            return True
        if event is not None and queued >= self.hard_limit:
            return False
        if event is not None and self.alarms_first and self._bulk >= JUMP_PAST and alarm_event(event):
            self._alarms.append((event, self._others_in))
        else:
            self._append(event)
        self._ready.set()
        return True

    def _append(self, event: Event | None) -> None:
        self._items.append(event)
        if _bulk(event):
            self._bulk += 1
        else:
            self._others_in += 1

    def end(self) -> None:
        self._append(None)
        self._ready.set()

    def clear(self) -> None:
        self._items.clear()
        self._alarms.clear()
        self._bulk = 0
        self._others_in = self._others_out = 0

    def _next(self) -> Event | None:
        """An alarm once every other event queued before it went; else the oldest event."""
        if self._alarms and self._alarms[0][1] <= self._others_out:
            return self._alarms.popleft()[0]
        event = self._items.popleft()
        if _bulk(event):
            self._bulk -= 1
        else:
            self._others_out += 1
        return event

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            while not self._items and not self._alarms:
                self._ready.clear()
                await self._ready.wait()
            event = self._next()
            self.taken += 1
            if event is None:
                return
            yield event


class EventBus:
    def __init__(self, logs_dir: Path | None = None) -> None:
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._pumps: dict[Subscription, asyncio.Task[None]] = {}
        self.closed = False
        self.attempt = 0  # of the last event published: the bus's own notices belong to it
        self.error_log: Path | None = None
        if logs_dir is not None:
            self.errors_to(logs_dir)

    def errors_to(self, logs_dir: Path) -> None:
        """Write the traceback of a sink that raises to ``logs_dir/console.err`` (the run folder)."""
        self.error_log = logs_dir / CONSOLE_ERR

    def subscribe(
        self,
        name: str = "subscriber",
        lag_limit: int = 10_000,
        hard_limit: int = 200_000,
        busy: Callable[[], bool] | None = None,
        alarms_first: bool | None = None,
    ) -> Subscription:
        sub = Subscription(name, lag_limit, hard_limit, busy, alarms_first)
        self._subs.append(sub)
        return sub

    def add_sink(
        self,
        name: str,
        handler: Handler,
        lag_limit: int = 10_000,
        hard_limit: int = 200_000,
        busy: Callable[[], bool] | None = None,
        alarms_first: bool | None = None,
    ) -> Subscription:
        """Run ``handler`` for every event in a task of its own; a handler that raises is detached.
        ``busy``, ``alarms_first``: see ``Subscription``."""
        sub = self.subscribe(name, lag_limit, hard_limit, busy, alarms_first)
        task = asyncio.get_running_loop().create_task(self._pump(sub, handler), name=f"sink:{name}")
        self._pumps[sub] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return sub

    async def _pump(self, sub: Subscription, handler: Handler) -> None:
        async for event in sub:
            try:
                result = handler(event)
                if result is not None and inspect.isawaitable(result):  # most handlers return None
                    await result
            except Exception as exc:  # noqa: BLE001 - a broken view must not take the run with it
                last = traceback.format_exception_only(exc)[-1].strip()
                where = self._log_error(sub, event, exc)
                self._detach(sub, f"its handler raised {last}{where}")
                return

    def _log_error(self, sub: Subscription, event: Event, exc: BaseException) -> str:
        """Append the sink's traceback to console.err; a note saying where it went, or "" if nowhere."""
        if self.error_log is None:
            return ""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        what = f"the {sub.name} view raised on a {type(event).__name__} event (attempt {self.attempt})"
        text = f"{stamp} {what}:\n" + "".join(traceback.format_exception(exc)) + "\n"
        try:
            private_text(self.error_log, text, append=True)  # small, once per sink: not worth a thread
        except OSError:
            return ""  # a full or read-only disk: the Notice still names the error
        return f" (traceback in {self.error_log})"

    def _detach(self, sub: Subscription, why: str) -> None:
        if sub.detached is not None:
            return
        sub.detached = why
        sub.clear()
        sub.end()
        self.publish(Notice(self.attempt, f"the {sub.name} view was detached: {why}; the run goes on"))

    def publish(self, event: Event) -> None:
        if self.closed:
            return
        self.attempt = event.attempt
        for sub in list(self._subs):
            if not sub.put(event):
                self._detach(sub, f"it fell {sub.hard_limit} events behind")

    def dropped(self) -> tuple[tuple[str, int], ...]:
        return tuple((s.name, s.dropped) for s in self._subs if s.dropped)

    async def close(self, stall_s: float = 0.5, drain_s: float = 30.0) -> None:
        """End every subscription after what is queued and let the sinks drain: a sink that takes
        nothing off its queue for ``stall_s`` (stuck, not busy) is cancelled, and none gets more
        than ``drain_s`` in all (a sink that says it is busy included)."""
        self.closed = True
        for sub in self._subs:
            sub.end()
        deadline = asyncio.get_running_loop().time() + drain_s
        seen = {s: s.taken for s in self._subs}
        while self._tasks and asyncio.get_running_loop().time() < deadline:
            await asyncio.wait(list(self._tasks), timeout=stall_s)
            for s, task in list(self._pumps.items()):
                if not task.done() and s.taken == seen[s] and not s.busy():
                    task.cancel()
            seen = {s: s.taken for s in self._subs}
        for task in list(self._tasks):
            task.cancel()
