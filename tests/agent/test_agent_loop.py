"""The agent's single loop never waits on its ranks: a stop's grace and a hung rank's py-spy dump
run beside it, and the agent keeps answering the console meanwhile."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import wait_for
from mscon.agent import protocol as P

# A rank that ignores TERM: only the KILL at the end of the grace ends it.
STUBBORN = """\
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", flush=True)
while True:
    time.sleep(3600)
"""

# py-spy stand-in: holds on until the test lets it go (as a slow dump of a big process would).
FAKE_PY_SPY = """\
#!/bin/sh
i=0
while [ ! -e "$MSCON_TEST_RELEASE" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
echo "Thread 1 (idle): fake stack of pid $4"
"""


class Agent:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mscon.agent", "--node", "n1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
        )
        self.received: list[P.Message] = []
        # Read by a thread: a deadline holds even when the agent sends nothing at all.
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def send(self, msg: P.Message) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(P.encode(msg))
        self.proc.stdin.flush()

    def until(self, pred, timeout: float = 20.0) -> P.Message:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"timed out; got {self.received[-5:]}") from None
            if not line:
                raise AssertionError(f"agent output ended; got {self.received[-5:]}")
            msg = P.decode(line)
            self.received.append(msg)
            if pred(msg):
                return msg

    def index(self, pred) -> int:  # noqa: ANN001
        return next(i for i, m in enumerate(self.received) if pred(m))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _start(tmp_path: Path, argv: tuple[str, ...], n: int = 1, grace_s: float = 2.0) -> P.Start:
    procs = tuple(
        P.ProcSpec(name=f"r{i}", rank=i, local_rank=i, argv=argv, env={"RANK_ID": str(i)}) for i in range(n)
    )
    return P.Start(
        run_id="t",
        node="n1",
        attempt=0,
        run_dir=str(tmp_path / "run"),
        cwd=str(tmp_path),
        procs=procs,
        grace_s=grace_s,
    )


def _started(a: Agent, n: int) -> dict[str, int]:
    pids: dict[str, int] = {}
    while len(pids) < n:
        m = a.until(lambda m: isinstance(m, P.ProcStarted))
        pids[m.name] = m.pid
    for name in pids:
        a.until(lambda m, name=name: isinstance(m, P.LogBatch) and m.name == name and "up" in m.lines)
    return pids


def _resolve(a: Agent) -> P.Resolved:
    a.send(P.Resolve(host="localhost"))
    return a.until(lambda m: isinstance(m, P.Resolved), timeout=5.0)


def _reaped(pid: int, timeout: float = 10.0) -> bool:
    """The process is gone from /proc: its parent (the agent) has reaped it, not only seen it die."""
    return wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout, f"pid {pid} reaped")


def test_the_agent_answers_while_its_ranks_take_their_grace(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    a = Agent()
    try:
        a.until(lambda m: isinstance(m, P.Hello))
        a.send(_start(tmp_path, (sys.executable, str(script)), n=2))
        pids = _started(a, 2)
        a.send(P.Stop(reason="test", grace_s=60.0))  # both ignore the TERM: 60 s until the KILL
        assert _resolve(a).address is not None  # answered at once, not after the grace
        assert not any(isinstance(m, P.ProcExited) for m in a.received)
        assert all(os.path.exists(f"/proc/{pid}") for pid in pids.values())
        a.send(P.Stop(reason="now", grace_s=0.0))  # a second stop with no grace brings the KILL forward
        a.until(lambda m: isinstance(m, P.AllExited), timeout=10.0)
        exits = [m for m in a.received if isinstance(m, P.ProcExited)]
        assert sorted(m.name for m in exits) == ["r0", "r1"]
        assert all(m.signal == "SIGKILL" and m.stopped_by_agent for m in exits)
        a.send(P.Shutdown())
        assert a.proc.wait(timeout=10) == 0
    finally:
        a.close()


def test_a_hung_ranks_stack_is_taken_beside_the_loop(tmp_path: Path) -> None:
    """py-spy may take seconds: the agent answers meanwhile, and the ProcHung (with the stack)
    still comes before the exit of the rank it describes."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    spy = bin_dir / "py-spy"
    spy.write_text(FAKE_PY_SPY)
    spy.chmod(0o755)
    release = tmp_path / "release"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env["MSCON_TEST_RELEASE"] = str(release)
    a = Agent(env)
    try:
        a.until(lambda m: isinstance(m, P.Hello))
        a.send(_start(tmp_path, (sys.executable, str(script)), n=2))
        pids = _started(a, 2)
        a.send(P.Inspect(names=("r0",), reason="test"))
        assert _resolve(a).address is not None  # while py-spy still holds on
        assert not any(isinstance(m, P.ProcHung) for m in a.received)
        os.kill(pids["r0"], signal.SIGKILL)
        assert _reaped(pids["r0"])  # the agent has seen the exit; its report waits for the ProcHung
        release.touch()
        hung = a.until(lambda m: isinstance(m, P.ProcHung))
        assert hung.name == "r0" and hung.why == "test"  # the Inspect's reason: the limit that fired
        assert hung.stack == f"Thread 1 (idle): fake stack of pid {pids['r0']}"
        a.until(lambda m: isinstance(m, P.AllExited), timeout=10.0)
        hung_at = a.index(lambda m: isinstance(m, P.ProcHung))
        exit_at = a.index(lambda m: isinstance(m, P.ProcExited) and m.name == "r0")
        assert hung_at < exit_at
        assert a.received[exit_at].signal == "SIGKILL"  # type: ignore[attr-defined]
        a.send(P.Shutdown())
        assert a.proc.wait(timeout=10) == 0
    finally:
        a.close()
        release.touch()


# A rank that prints a line every 20 ms: never silent.
CHATTY = """\
import time
print("up", flush=True)
while True:
    print("step", flush=True)
    time.sleep(0.02)
"""


def test_an_inspect_for_a_rank_the_agent_sees_alive_is_not_a_hang(tmp_path: Path) -> None:
    """The console asks after a silence on its own clock (it may read late); the agent reports the
    rank hung only when it has been silent that long on the node too."""
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    a = Agent()
    try:
        a.until(lambda m: isinstance(m, P.Hello))
        a.send(_start(tmp_path, (sys.executable, str(script)), n=1))
        _started(a, 1)
        a.send(P.Inspect(names=("r0",), reason="no progress for 30 s (test)", silent_s=30.0))
        assert _resolve(a).address is not None  # answered after the Inspect, in order
        seen = len([m for m in a.received if isinstance(m, P.LogBatch)])
        a.until(lambda m: len([x for x in a.received if isinstance(x, P.LogBatch)]) >= seen + 3)
        assert not any(isinstance(m, P.ProcHung) for m in a.received)
        # The same rank asked after with a limit it did pass (0 s): reported, with the console's reason.
        a.send(P.Inspect(names=("r0",), reason="no progress for 0 s (test)", silent_s=0.0))
        hung = a.until(lambda m: isinstance(m, P.ProcHung))
        assert hung.name == "r0" and hung.why == "no progress for 0 s (test)"
    finally:
        a.close()
