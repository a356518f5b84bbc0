"""Where the nodes' answers go during preflight.

While preflight runs, the session's inbox is swapped for a ``Router``: the answers to the checks and
the mesh probe go to the queue of their conversation (one per node and kind of answer), everything
else on to the supervisor, which keeps serving Ctrl-C meanwhile.
"""

from __future__ import annotations

import asyncio
import time

from mscon.agent.protocol import CheckResult, ChecksDone, MeshListening, MeshResult, Message
from mscon.console.engine.session import Inbox

# What a conversation reads: when the answer arrived (ns since the epoch), and the answer, or None
# when the node's channel ended.
Answers = asyncio.Queue[tuple[int, Message | None]]


class Router:
    """Stands in for the session's inbox during preflight: the nodes' answers go to the queue of
    their conversation, everything else (and lost channels, too) on to the supervisor."""

    _STREAMS: dict[type[Message], str] = {
        CheckResult: "checks",
        ChecksDone: "checks",
        MeshListening: "listen",
        MeshResult: "probe",
    }

    def __init__(self, downstream: Inbox) -> None:
        self.downstream = downstream
        self.queues: dict[tuple[str, str], Answers] = {}

    def queue(self, node: str, stream: str) -> Answers:
        return self.queues.setdefault((node, stream), asyncio.Queue())

    def put_nowait(self, item: tuple[str, Message | None]) -> None:
        node, msg = item
        now = time.time_ns()  # the clock test's receive time: stamped on arrival, not when read
        if msg is None:
            for (n, _), q in self.queues.items():
                if n == node:
                    q.put_nowait((now, None))
            self.downstream.put_nowait(item)
            return
        stream = self._STREAMS.get(type(msg))
        if stream is None:
            self.downstream.put_nowait(item)
        else:
            self.queue(node, stream).put_nowait((now, msg))

    async def put(self, item: tuple[str, Message | None]) -> None:
        self.put_nowait(item)


class Lost(Exception):
    """The node's channel ended, or it did not answer in time."""


async def next_answer(q: Answers, deadline: float) -> tuple[int, Message]:
    """The next answer on ``q`` and when it arrived, by ``deadline`` (time.monotonic)."""
    left = deadline - time.monotonic()
    try:
        ts, msg = await asyncio.wait_for(q.get(), max(left, 0.01))
    except TimeoutError:
        raise Lost("no answer from the agent in time") from None
    if msg is None:
        raise Lost("lost the node during the checks")
    return ts, msg
