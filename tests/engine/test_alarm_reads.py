"""Alarms ahead of a backlog in the console's reading of a channel (issue 44): an exit that an
agent's channel holds behind a backlog of log batches reaches the supervisor's queue while the
reader still waits for room with the batches, not after them. The channel here is a real asyncio
StreamReader fed the real protocol's lines, as a local or Slurm channel is."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from conftest import until
from mscon.agent.protocol import PROTOCOL_VERSION, Hello, LogBatch, Message, ProcExited, encode
from mscon.console.config.inventory import Inventory, NodeSpec, load_inventory
from mscon.console.engine.inputs import Alarm, Inputs
from mscon.console.engine.plan import build_plan
from mscon.console.engine.session import ClusterSession
from mscon.console.transport import AgentChannel, NodeTransport, TransportKind
from mscon.console.transport.base import stream_line_ready

LOG = LogBatch("a", "r0", 0, 0, ("step 1",), 1)
FAILED = ProcExited("a", "r1", 1, 99, 6, None, None, 3, stopped_by_agent=False)


class StreamChannel(AgentChannel):
    """What the agent writes arrives in ``reader``'s buffer (``feed``)."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader()

    def feed(self, *msgs: Message) -> None:
        self.reader.feed_data("".join(encode(m) for m in msgs).encode())

    async def _write(self, data: str) -> None:
        pass

    async def _readline(self) -> str:
        return (await self.reader.readline()).decode()

    def _line_ready(self) -> bool:
        return stream_line_ready(self.reader)

    async def close(self, wait_s: float = 10.0) -> None:
        self.reader.feed_eof()

    def _stderr_raw(self) -> str:
        return ""


class StreamTransport(NodeTransport):
    kind = TransportKind.SSH

    def __init__(self, node: NodeSpec, channels: dict[str, StreamChannel]) -> None:
        super().__init__(node)
        self.channels = channels

    async def connect(self) -> None:
        self.home = "/fake"

    async def ensure_agent(self, bundle: Any) -> str:
        return "/fake/agent"

    async def upload_workdir(self, archive: Any) -> str:
        raise NotImplementedError

    async def start_agent(self, agent_dir: str, python: str, mode: dict | None = None) -> AgentChannel:
        channel = self.channels[self.node.name] = StreamChannel()
        channel.feed(Hello(self.node.name, PROTOCOL_VERSION, 1, "host", "3.11", "fake", None))
        return channel

    async def fetch_run_dir(self, remote: str, local: str, logs_root: str | None = None, **_: Any) -> int:
        return 0

    async def holds_run(self, run_id: str) -> bool:
        return False

    async def close(self) -> None:
        pass

    @property
    def syncs_workdir(self) -> bool:
        return False


def inventory(tmp_path: Path, nodes: int = 1) -> Inventory:
    (tmp_path / "train.py").write_text("print('never run')\n")
    doc = {
        "name": "reads",
        "device_target": "CPU",
        "nodes": [{"name": "abc"[i], "host": f"10.0.0.{i + 1}", "devices": 2} for i in range(nodes)],
        "scheduler": {"port": 8118},
        "job": {"workdir": str(tmp_path), "script": "train.py"},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_inventory(path)


async def behind(tmp_path: Path) -> tuple[ClusterSession, dict[str, StreamChannel], Inputs]:
    """A session of one node "a" whose console is behind: its queue (4) full of log batches."""
    inv = inventory(tmp_path)
    channels: dict[str, StreamChannel] = {}
    inbox = Inputs(backlog=4)
    session = ClusterSession(
        inv,
        build_plan(inv, "train.py", []),
        "run-1",
        lambda ev: None,
        inbox,
        transport_factory=lambda inv, node, ssh: StreamTransport(node, channels),
    )
    assert await session.open() == []
    for _ in range(4):
        await inbox.put(("a", LOG))
    return session, channels, inbox


def test_an_exit_behind_a_backlog_in_the_channel_reaches_the_queue_while_the_batches_wait(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        session, channels, inbox = await behind(tmp_path)
        channels["a"].feed(*[LOG] * 50, FAILED)  # the agent wrote these before the console read
        got: list[object] = []

        def alarm_in() -> bool:
            while not inbox.empty():
                got.append(inbox.get_nowait())
                if isinstance(got[-1], Alarm):
                    return True
                break  # one at a time: each take lets the reader in when there is room
            return False

        await until(alarm_in, 5, "the exit's alarm")
        assert got[-1] == Alarm("a", FAILED)
        assert got.count(("a", LOG)) < 50, "the alarm came only after the backlog ahead of it"
        await session.abort()

    asyncio.run(main())


def test_a_reader_takes_what_is_buffered_in_order_and_no_more_than_its_bound() -> None:
    async def main() -> None:
        channel = StreamChannel()
        channel.feed(LOG, LOG, FAILED, LOG)
        assert await channel.recv_ready() == [LOG, LOG, FAILED, LOG]
        channel.feed(*[LOG] * 10)
        first = await channel.recv_ready(max_bytes=len(encode(LOG)) * 3)
        assert first == [LOG] * 4  # the first, then three lines' worth
        assert await channel.recv_ready() == [LOG] * 6
        channel.reader.feed_data(b"a login banner\n")
        channel.feed(LOG)
        channel.reader.feed_eof()
        assert await channel.recv_ready() == [LOG]  # what is not a message is skipped
        assert await channel.recv_ready() == []

    asyncio.run(main())


def test_an_ssh_channel_tells_when_a_whole_line_is_buffered() -> None:
    """ssh_line_ready looks into asyncssh's receive buffer (no public peek): an upgrade that moves
    it makes this fail rather than silently read one message at a time."""
    from asyncssh.stream import SSHClientStreamSession, SSHReader
    from mscon.console.transport.ssh import ssh_line_ready

    async def main() -> None:
        session = SSHClientStreamSession()
        session._encoding = "utf-8"  # as the agent's channel is opened (text, not bytes)
        reader: SSHReader[str] = SSHReader(session, None)  # type: ignore[arg-type]
        session.data_received('{"type":', None)
        assert not ssh_line_ready(reader)
        session.data_received('"x"}\n{"ty', None)
        assert ssh_line_ready(reader)
        assert await reader.readline() == '{"type":"x"}\n'
        assert not ssh_line_ready(reader)
        session.eof_received()
        assert not ssh_line_ready(reader)  # the partial line at the end: readline deals with it

    asyncio.run(main())


def test_a_reader_behind_decodes_no_sample_it_drops(tmp_path: Path, monkeypatch: Any) -> None:
    """A summary tick of thousands of nodes arrives while the queue is full: the samples are dropped
    undecoded (the readers decoded them all in one turn of the loop, then dropped them, while an exit
    waited for the supervisor's next turn)."""
    from mscon.agent.protocol import NodeSummary, RankCount
    from mscon.console.transport import base as base_mod

    decoded: list[str] = []
    real = base_mod.decode

    def counting(line: str) -> Message:
        decoded.append(line)
        return real(line)

    monkeypatch.setattr(base_mod, "decode", counting)  # what a channel's lines are decoded with

    async def main() -> None:
        session, channels, inbox = await behind(tmp_path)
        decoded.clear()
        summary = NodeSummary("a", 1.0, (RankCount("r0", 0, 5, 1),))
        channels["a"].feed(*[summary] * 30, LOG)
        await until(lambda: inbox.dropped == 30, 5, "the samples dropped")
        assert decoded == [], "samples decoded only to be dropped"
        while not inbox.empty():
            inbox.get_nowait()
        await until(lambda: inbox.queued == 1, 5, "the log batch after them")
        assert len(decoded) == 1
        await session.abort()

    asyncio.run(main())


def test_a_lines_class_is_told_by_its_first_bytes() -> None:
    from mscon.console.transport.base import line_class

    assert line_class(encode(FAILED)) is ProcExited
    assert line_class(encode(LOG)) is LogBatch
    assert line_class('{"type":"no_such_message"}\n') is None
    assert line_class("a login banner\n") is None


def test_an_answer_someone_waits_for_does_not_wait_for_room_in_the_queue(tmp_path: Path) -> None:
    from mscon.agent.protocol import Resolve, Resolved

    async def main() -> None:
        session, channels, inbox = await behind(tmp_path)
        asked = asyncio.ensure_future(session.request("a", Resolve(host="sched"), Resolved, 5.0))
        await until(lambda: "resolved" in session.links["a"].waiters, 5, "the request")
        channels["a"].feed(Resolved(node="a", host="sched", address="10.0.0.9"))
        assert await asyncio.wait_for(asked, 5) == Resolved(node="a", host="sched", address="10.0.0.9")
        await session.abort()

    asyncio.run(main())
