"""The node agent driven directly over its stdin/stdout, as the console drives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from conftest import FAKE_RANK, pipe_bytes, wait_for, wait_gone
from mscon.agent import layout
from mscon.agent import protocol as P


class AgentUnderTest:
    def __init__(self, node: str = "n1") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mscon.agent", "--node", node],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.received: list[P.Message] = []

    def send(self, msg: P.Message) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(P.encode(msg))
        self.proc.stdin.flush()

    def until(self, pred, timeout: float = 30.0) -> P.Message:  # noqa: ANN001
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"agent output ended; got {self.received[-5:]}")
            msg = P.decode(line)
            self.received.append(msg)
            if pred(msg):
                return msg
        raise AssertionError("timed out")


def _start(tmp_path: Path, n: int, args: list[str]) -> P.Start:
    procs = tuple(
        P.ProcSpec(
            name=f"r{i}",
            rank=i,
            local_rank=i,
            argv=(sys.executable, str(FAKE_RANK), *args),
            env={"RANK_ID": str(i), "MS_ROLE": "MS_WORKER"},
        )
        for i in range(n)
    )
    return P.Start(
        run_id="t",
        node="n1",
        attempt=0,
        run_dir=str(tmp_path / "run"),
        cwd=str(tmp_path),
        procs=procs,
        grace_s=2.0,
    )


def test_streams_sequenced_logs_and_reports_exits(tmp_path: Path) -> None:
    a = AgentUnderTest()
    hello = a.until(lambda m: isinstance(m, P.Hello))
    assert hello.protocol == P.PROTOCOL_VERSION
    a.send(_start(tmp_path, 2, ["--steps", "50", "--rate", "0"]))
    a.until(lambda m: isinstance(m, P.AllExited))
    a.send(P.Shutdown())
    assert a.proc.wait(timeout=10) == 0
    for rank in ("r0", "r1"):
        batches = [m for m in a.received if isinstance(m, P.LogBatch) and m.name == rank]
        seq = 0
        for b in batches:  # sequence numbers are contiguous: a consumer can detect a gap
            assert b.seq == seq
            seq += len(b.lines)
        lines = [line for b in batches for line in b.lines]
        assert lines[-1] == "training finished" and sum("loss is" in x for x in lines) == 50
        exits = [m for m in a.received if isinstance(m, P.ProcExited) and m.name == rank]
        assert len(exits) == 1 and exits[0].ok
        metrics = [
            x for m in a.received if isinstance(m, P.MetricBatch) and m.name == rank for x in m.metrics
        ]
        assert [m.step for m in metrics] == list(range(1, 51))
    assert Path(layout.log_path(tmp_path / "run", 0, "r1")).read_text().count("loss is") == 50


def test_a_killed_rank_is_reported_and_its_siblings_stopped(tmp_path: Path) -> None:
    a = AgentUnderTest()
    a.until(lambda m: isinstance(m, P.Hello))
    a.send(_start(tmp_path, 3, ["--steps", "100000", "--rate", "20"]))
    started = {}
    while len(started) < 3:
        m = a.until(lambda m: isinstance(m, P.ProcStarted))
        started[m.name] = m.pid
    a.until(lambda m: isinstance(m, P.LogBatch) and m.name == "r1" and any("step: 2," in x for x in m.lines))
    os.kill(started["r1"], signal.SIGKILL)
    dead = a.until(lambda m: isinstance(m, P.ProcExited) and m.name == "r1")
    assert (
        dead.signal == "SIGKILL" and dead.signum == 9 and dead.shell_code == 137 and not dead.stopped_by_agent
    )
    a.until(lambda m: isinstance(m, P.AllExited), timeout=10)
    others = [m for m in a.received if isinstance(m, P.ProcExited) and m.name != "r1"]
    assert len(others) == 2 and all(m.stopped_by_agent for m in others)
    a.send(P.Shutdown())
    assert a.proc.wait(timeout=10) == 0


def test_stdin_eof_stops_everything(tmp_path: Path) -> None:
    a = AgentUnderTest()
    a.until(lambda m: isinstance(m, P.Hello))
    a.send(_start(tmp_path, 2, ["--steps", "100000", "--rate", "20"]))
    pids = [a.until(lambda m: isinstance(m, P.ProcStarted)).pid for _ in range(2)]
    ranks = [psutil.Process(p) for p in pids]
    assert a.proc.stdin is not None
    a.proc.stdin.close()  # the console (or its SSH channel) went away
    assert a.proc.wait(timeout=10) == 0
    assert wait_gone(ranks, 5) == []


def test_agent_killed_takes_its_ranks_along(tmp_path: Path) -> None:
    a = AgentUnderTest()
    a.until(lambda m: isinstance(m, P.Hello))
    a.send(_start(tmp_path, 2, ["--steps", "100000", "--rate", "20"]))
    pids = [a.until(lambda m: isinstance(m, P.ProcStarted)).pid for _ in range(2)]
    ranks = [psutil.Process(p) for p in pids]
    a.proc.kill()  # no chance to clean up: the parent-death signal does it
    a.proc.wait()
    assert wait_gone(ranks, 5) == []


def test_a_console_that_stops_reading_never_stalls_the_agent(tmp_path: Path) -> None:
    """The console falls behind (a starved laptop, Ctrl-Z): the agent's output backs up. It must
    still act on its node: a rank that dies has its siblings stopped at once, not when the console
    reads again. The lines it cannot send yet wait in the logs (its queue stays bounded) and all
    arrive once the console reads again, none lost, none twice."""
    a = AgentUnderTest()
    a.until(lambda m: isinstance(m, P.Hello))
    # 3 x 20,000 lines a second: megabytes the console does not take.
    a.send(_start(tmp_path, 3, ["--steps", "100000000", "--rate", "2000", "--lines-per-step", "9"]))
    started = {}
    while len(started) < 3:
        m = a.until(lambda m: isinstance(m, P.ProcStarted))
        started[m.name] = m.pid
    siblings = [psutil.Process(started[n]) for n in ("r0", "r2")]
    agent = psutil.Process(a.proc.pid)
    # Nobody reads: wait until the pipe to the "console" is full, then until 8 MiB more of the ranks'
    # lines are written behind it: more than the agent's outbox holds (4 MiB, agent/outbox.py), so it
    # has had to stop reading the logs and leave lines waiting in them.
    out = a.proc.stdout
    assert out is not None
    wait_for(
        lambda: pipe_bytes(out.fileno()) >= 48 * 1024, 60, "the agent's stdout pipe to fill (48 of 64 KiB)"
    )
    logs = [Path(layout.log_path(tmp_path / "run", 0, r)) for r in ("r0", "r1", "r2")]
    behind = sum(p.stat().st_size for p in logs) + 8 * 2**20
    wait_for(
        lambda: sum(p.stat().st_size for p in logs) >= behind, 60, "8 MiB of rank lines behind the full pipe"
    )
    os.kill(started["r1"], signal.SIGKILL)
    assert wait_gone(siblings, 8) == [], "the agent stopped r0 and r2 without the console reading"
    assert agent.memory_info().rss < 300 * 2**20  # what it could not send did not pile up in memory
    dead = a.until(lambda m: isinstance(m, P.ProcExited) and m.name == "r1", timeout=60)
    assert dead.signal == "SIGKILL" and not dead.stopped_by_agent
    a.until(lambda m: isinstance(m, P.AllExited), timeout=60)
    for rank in ("r0", "r1", "r2"):
        batches = [m for m in a.received if isinstance(m, P.LogBatch) and m.name == rank]
        streamed = [line for b in batches for line in b.lines]
        starts = [sum(len(x.lines) for x in batches[:i]) for i in range(len(batches))]
        assert [b.seq for b in batches] == starts  # contiguous: none lost, none twice
        assert streamed == Path(layout.log_path(tmp_path / "run", 0, rank)).read_text().splitlines()
    a.send(P.Shutdown())
    assert a.proc.wait(timeout=10) == 0
