"""The agent's output to the console, written by a thread of its own.

A console that falls behind (a starved laptop, a suspended process, a slow link) backs the agent's
stdout up. Written from the agent's loop, that would stall the loop itself: a rank that dies would
have its siblings stopped only once the console reads again. Here the loop only queues, and asks
``has_room()`` before it reads more of its ranks' logs: while streamed data (log lines, metrics)
beyond ``budget`` bytes waits, the lines stay in the log files, to be read once the console has
caught up. Nothing is dropped.

Alarms (a rank's exit, a hang, blame, the agent's own error: ``Message.alarm``) go in a lane of
their own, written before whatever else waits: the console's policy hears of a failure ahead of
any backlog of log and metric batches (issue 44). Within each lane the order is kept.
"""

from __future__ import annotations

import collections
import threading
from typing import TextIO

DEFAULT_BUDGET = 4 * 1024 * 1024  # bytes of streamed messages waiting to be written
_WRITE_MAX = 256 * 1024  # bytes taken off the queue for one write (an alarm waits for at most one)


class ConsoleGone(Exception):
    """The console's channel is closed: nothing more can reach it."""


class Outbox:
    def __init__(self, out: TextIO, budget: int = DEFAULT_BUDGET) -> None:
        self.out = out
        self.budget = budget
        self.broken = False
        self._queue: collections.deque = collections.deque()  # (line, streamed)
        self._alarms: collections.deque = collections.deque()  # lines written ahead of the queue
        self._stream_bytes = 0
        self._closing = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._write, name="outbox", daemon=True)
        self._thread.start()

    def put(self, line: str, streamed: bool, alarm: bool = False) -> bool:
        """Queue one line (``alarm``: ahead of every line that is not one); False once the output
        has failed (the console is gone)."""
        with self._cv:
            if self.broken:
                return False
            if alarm:
                self._alarms.append(line)
            else:
                if streamed:
                    self._stream_bytes += len(line)
                self._queue.append((line, streamed))
            self._cv.notify()
        return True

    def has_room(self) -> bool:
        """Whether more streamed data should be read now (False: the console is behind)."""
        return self._stream_bytes < self.budget

    def close(self, wait_s: float) -> None:
        """Write what is queued (for at most ``wait_s``), then stop the writer."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(wait_s)

    def _write(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._alarms and not self._closing:
                    self._cv.wait()
                if not self._queue and not self._alarms:
                    return
                # Everything queued in one write: one system call, and one hand-over of the GIL,
                # for what the loop queued meanwhile (a flush of 64 ranks is 128 messages). The
                # alarms first, whatever waits in the other lane.
                lines, streamed = list(self._alarms), 0
                self._alarms.clear()
                size = 0
                while self._queue and size < _WRITE_MAX:
                    line, is_stream = self._queue.popleft()
                    lines.append(line)
                    size += len(line)
                    if is_stream:
                        streamed += len(line)
            try:
                self.out.write("".join(lines))
                self.out.flush()
            except (OSError, ValueError):  # BrokenPipeError included; ValueError: closed file
                with self._cv:
                    self.broken = True  # the next put() says so: the agent's loop treats it as ever
                    self._queue.clear()
                    self._alarms.clear()
                return
            finally:
                with self._cv:
                    self._stream_bytes -= streamed
