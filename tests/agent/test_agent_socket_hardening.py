"""A detached agent's Unix socket against a careless or hostile owner: clients that leave without
a word, malformed messages, a line too long; and the line reader's cost on a line that never ends."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from detached_agents import DetachedAgent
from mscon.agent import protocol as P
from mscon.agent.detached import daemon
from mscon.agent.streams import LineSplitter, LineTooLong, read_lines


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[DetachedAgent, str]]:
    """A detached single-node run (its agent is its coordinator), and its socket's path."""
    a = DetachedAgent("n0")
    try:
        a.start(tmp_path / "run", 0)
        done = a.detach(role=P.Role.COORDINATOR, nodes=("n0",))
        assert done.error == "" and done.socket
        yield a, done.socket
    finally:
        a.kill()
    assert b"Traceback" not in a.stderr, a.stderr.decode()


class Console:
    """One client on the agent's socket, reading JSON lines."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.buf = b""

    def line(self) -> bytes:
        """The next line; b"" at the end."""
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return b""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def message(self) -> P.Message:
        line = self.line()
        assert line, "the agent closed the connection"
        return P.decode(line.decode())

    def ended(self) -> bool:
        while True:
            if self.line() == b"":
                return True

    def close(self) -> None:
        self.sock.close()


def test_clients_that_leave_without_a_word_leave_no_thread_behind(agent: tuple[DetachedAgent, str]) -> None:
    a, path = agent
    baseline = a.threads()
    for i in range(50):
        c = Console(path)
        if i % 2:
            assert isinstance(c.message(), P.Hello)  # served, then gone (no end())
        c.close()  # or gone at once, as `mscon ls` checks that a run is alive
    wait_for(lambda: a.threads() <= baseline, 5, f"the agent back to {baseline} threads")
    # And the agent still serves.
    c = Console(path)
    assert isinstance(c.message(), P.Hello)
    c.close()


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        pytest.param(b"not json", "bad message", id="not-json"),
        pytest.param(b"\xff\xfe\x00", "bad message", id="not-utf8"),
        pytest.param(b'{"type": ["attach"]}', "bad message", id="list-as-type"),
        pytest.param(b"[" * 100_000, "bad message", id="deep"),  # past the recursion limit
        pytest.param(b'{"type": "start", "procs": [1]}', "bad message", id="bad-procs"),
        pytest.param(
            b'{"type": "attach", "log_from": {"r0": Infinity}, "log_attempt": 0}', "bad attach", id="inf"
        ),
        pytest.param(b'{"type": "attach", "log_from": {"r0": NaN}}', "bad attach", id="nan"),
        pytest.param(b'{"type": "attach", "log_from": [1]}', "bad attach", id="list-log-from"),
        pytest.param(b'{"type": "attach", "journal_from": "0"}', "bad attach", id="string-count"),
        pytest.param(b'{"type": "attach", "log_from": {"r0": 1e400}}', "bad attach", id="huge-float"),
        pytest.param(b'{"type": "run_command", "action": ["stop"]}', "bad run_command", id="bad-action"),
    ],
)
def test_a_malformed_message_is_answered_with_an_error_and_the_run_goes_on(
    agent: tuple[DetachedAgent, str], line: bytes, answer: str
) -> None:
    a, path = agent
    c = Console(path)
    assert isinstance(c.message(), P.Hello)
    c.sock.sendall(line + b"\n")
    reply = c.message()
    while not isinstance(reply, P.AgentError):  # an Attach may replay a little first
        reply = c.message()
    assert reply.node == "n0" and reply.message.startswith(answer), reply
    c.close()
    # The agent is unharmed: it serves the next console, and the rank runs on.
    again = Console(path)
    assert isinstance(again.message(), P.Hello)
    again.sock.sendall(P.encode(P.Attach(read_only=True, follow=False)).encode())
    kinds = []
    while not kinds or kinds[-1] != "replay_done":
        kinds.append(again.message().type)
    assert again.ended()
    a.drain()
    assert not [m for m in a.seen if isinstance(m, (P.ProcExited, P.Coord))]
    assert a.proc.poll() is None


def test_a_line_over_the_bound_is_refused_without_buffering_it(agent: tuple[DetachedAgent, str]) -> None:
    a, path = agent
    c = Console(path)
    assert isinstance(c.message(), P.Hello)
    cpu = sum(a.ps.cpu_times()[:2])
    sent = []

    def flood() -> None:  # 16 MiB, no newline
        try:
            for _ in range(256):
                c.sock.sendall(b"x" * 65536)
                sent.append(1)
        except OSError:
            pass

    writer = threading.Thread(target=flood)
    writer.start()
    reply = c.message()
    assert isinstance(reply, P.AgentError) and "over" in reply.message, reply
    assert c.ended()
    writer.join(10)
    assert len(sent) < 256, "the agent read the whole line"
    assert sum(a.ps.cpu_times()[:2]) - cpu < 1.0
    assert daemon.LINE_MAX <= 1 << 20
    again = Console(path)
    assert isinstance(again.message(), P.Hello)
    again.close()


# ------------------------------------------------------------------ the line reader


def test_a_long_line_costs_linear_time() -> None:
    """16 MiB without a newline, fed 64 KiB at a time: each byte copied about once (a growing bytes
    object re-copied per chunk took seconds)."""
    chunks = iter([b"y" * 65536] * 256 + [b"\nnext\n", b""])
    got: list[str] = []
    t0 = time.process_time()
    read_lines(lambda n: next(chunks), got.append)
    took = time.process_time() - t0
    assert [len(x) for x in got] == [16 << 20, 4]
    assert took < 0.5, f"{took:.2f}s of CPU for one 16 MiB line"


def test_the_splitter_keeps_lines_whole_and_bounded() -> None:
    split = LineSplitter(max_line=10)
    assert split.feed(b"ab") == []
    assert split.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
    assert split.rest() == b"f"
    assert split.feed(b"ghij\n") == [b"fghij"]
    with pytest.raises(LineTooLong):
        split.feed(b"0123456789x")  # too long before any newline comes
    with pytest.raises(LineTooLong):
        LineSplitter(max_line=3).feed(b"abcd\n")
