"""A Stop to every node goes out at once (issue 44): encoded once and handed to every channel in
one pass, never waiting behind a channel whose buffer does not drain (a node that stopped reading)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mscon.agent.protocol import Stop, encode
from mscon.console.engine.plan import build_plan
from mscon.console.engine.session import ClusterSession
from mscon.console.transport import AgentChannel
from test_alarm_reads import StreamChannel, StreamTransport, inventory


class StuckChannel(StreamChannel):
    """Its writes never drain (the agent stopped reading): an awaited send waits for ever."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[str] = []
        self.stuck = asyncio.Event()

    async def _write(self, data: str) -> None:
        self.written.append(data)
        await self.stuck.wait()

    def send_now(self, line: str) -> bool:
        self.written.append(line)
        return True


class StuckTransport(StreamTransport):
    async def start_agent(self, agent_dir: str, python: str, mode: dict | None = None) -> AgentChannel:
        channel = await super().start_agent(agent_dir, python, mode)
        stuck = self.channels[self.node.name] = StuckChannel()
        stuck.reader = channel.reader  # type: ignore[attr-defined]
        return stuck


def test_a_stop_is_handed_to_every_channel_without_waiting_for_one_that_does_not_drain(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        inv = inventory(tmp_path, nodes=3)
        channels: dict[str, Any] = {}
        session = ClusterSession(
            inv,
            build_plan(inv, "train.py", []),
            "run-1",
            lambda ev: None,
            asyncio.Queue(),  # type: ignore[arg-type]
            transport_factory=lambda inv, node, ssh: StuckTransport(node, channels),
        )
        assert await session.open() == []
        stop = Stop(reason="r1 failed", grace_s=3)
        await asyncio.wait_for(session.broadcast(stop), 5)
        assert {n: c.written for n, c in channels.items()} == {n: [encode(stop)] for n in channels}
        await asyncio.wait_for(session.ping(), 5)
        assert all(len(c.written) == 2 for c in channels.values())
        for c in channels.values():
            c.stuck.set()
        await session.abort()

    asyncio.run(main())
