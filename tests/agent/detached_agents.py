"""Real node agents driven over their stdin/stdout as the console drives them, then detached: the
same processes a detached run has on its nodes, started here without SSH."""

from __future__ import annotations

import contextlib
import queue
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from conftest import FAKE_RANK, wait_gone
from mscon.agent import protocol as P
from mscon.console.transport.link_tls import make_run_tls

RUN_TLS = make_run_tls()  # the run's certificate, as the console hands it over with the Detach

# The agent with its handshake deadline shortened, so that a test sees connections cut off in
# seconds; everything else is the agent as the console starts it.
_AGENT = (
    "import sys; from mscon.agent.detached import coord; coord.HANDSHAKE_S = float(sys.argv.pop(1)); "
    "from mscon.agent.main import main; sys.exit(main(sys.argv[1:]))"
)


class DetachedAgent:
    """One agent process: ``start`` a fake rank, ``detach`` it; its output is collected as it comes."""

    def __init__(self, node: str, nofile: int | None = None, handshake_s: float = 10.0) -> None:
        self.node = node

        def limit() -> None:
            if nofile is not None:
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

        self.proc = subprocess.Popen(
            [sys.executable, "-c", _AGENT, str(handshake_s), "--node", node],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=limit,
        )
        self.ps = psutil.Process(self.proc.pid)
        self.messages: queue.Queue = queue.Queue()
        self.seen: list[P.Message] = []
        self.stderr = b""
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._readers:
            t.start()
        self.until(lambda m: isinstance(m, P.Hello))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(P.ProtocolError):
                self.messages.put(P.decode(line.decode()))
        self.messages.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr += line

    def send(self, msg: P.Message) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(P.encode(msg).encode())
        self.proc.stdin.flush()

    def until(self, pred: Callable[[P.Message], bool], timeout: float = 20.0) -> P.Message:
        deadline = time.monotonic() + timeout
        for msg in self.seen:
            if pred(msg):
                return msg
        while True:
            try:
                msg = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{self.node}: timed out; last {self.seen[-5:]}") from None
            if msg is None:
                raise AssertionError(f"{self.node}: the agent's output ended; last {self.seen[-5:]}")
            self.seen.append(msg)
            if pred(msg):
                return msg

    def drain(self) -> None:
        """Take what the agent has said so far into ``seen``."""
        while True:
            try:
                msg = self.messages.get_nowait()
            except queue.Empty:
                return
            if msg is not None:
                self.seen.append(msg)

    def start(self, run_dir: Path, rank: int, steps: int = 100_000, rate: float = 20.0) -> P.ProcStarted:
        spec = P.ProcSpec(
            name=f"r{rank}",
            rank=rank,
            local_rank=0,
            argv=(sys.executable, str(FAKE_RANK), "--steps", str(steps), "--rate", str(rate)),
            env={"RANK_ID": str(rank), "MS_ROLE": "MS_WORKER"},
        )
        self.send(
            P.Start(
                run_id="hardening",
                node=self.node,
                attempt=0,
                run_dir=str(run_dir),
                cwd=str(run_dir.parent),
                procs=(spec,),
                grace_s=1.0,
            )
        )
        started = self.until(lambda m: isinstance(m, P.ProcStarted))
        assert isinstance(started, P.ProcStarted)
        return started

    def detach(self, **fields: object) -> P.Detached:
        fields = {"coordinator_host": "127.0.0.1", **fields}  # the coordinator binds one address
        tls = {"tls_cert": RUN_TLS.cert, "tls_key": RUN_TLS.key}
        self.send(P.Detach(secret="the run's secret", **tls, **fields))  # type: ignore[arg-type]
        done = self.until(lambda m: isinstance(m, P.Detached))
        assert isinstance(done, P.Detached)
        return done

    def threads(self) -> int:
        return self.ps.num_threads()

    def kill(self) -> None:
        """The agent and, through its parent-death signal, its ranks."""
        ranks = self.ps.children(recursive=True) if self.proc.poll() is None else []
        self.proc.kill()
        self.proc.wait(timeout=10)
        for t in self._readers:
            t.join(timeout=5)  # its stderr read to the end
        wait_gone(ranks, 10)
