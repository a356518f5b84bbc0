"""Console at scale: N simulated nodes x 8 fake ranks, driven through the real Supervisor.

    PYTHONPATH=.dev .venv/bin/python bench/scale.py [--nodes 1 10 100 1000] [--seconds 10]
        [--lines-per-s 2] [--steps-per-s 1] [--connect-ms 100] [--parallel 64] [--single-metrics]

The console is this process: the real ``Supervisor``, ``ClusterSession``, ``ClusterState``, event bus
and headless reporter (rank output to /dev/null), with a ``transport_factory`` whose nodes are fake
agents in a few worker processes (``--nodes-per-worker``, at most ``--max-workers``). Each node is a
real Unix socket connection to its worker, speaking the real protocol (``agent/protocol.py``: the
worker encodes with it, the console decodes what arrives). ``connect()`` takes the session's
connect semaphore (``ssh.max_parallel_connects`` = ``--parallel``) and waits ``--connect-ms``, the
stand-in for an SSH handshake and deploy. Each rank prints ``--lines-per-s`` log lines a second,
one of them a LossMonitor line per step (``--steps-per-s``); the fake agent flushes every
``flush_interval_s`` of the Start (0.1 s) as the real one does: one LogBatch per rank with lines and
one MetricBatch per rank with steps (``--single-metrics``: one Metric message per step, as before).
A fake agent whose socket is full holds its lines back and sends them later in larger batches
(a real agent's files grow meanwhile), so nothing is ever dropped.

After ``--seconds`` of steady output one rank is killed (its agent reports ProcExited, SIGKILL,
at once); the console must send Stop to every agent. Measured, per N:

- start: Supervisor.run() -> every node's agent up, and -> every rank started (ProcStarted of all
  ranks applied), wall and console CPU (this process, all threads);
- kill -> Stop: from the fake agent's kill (its clock) to the console's last Stop write, and to the
  last agent's receipt of it (same machine, same clock);
- order and loss: every LogBatch's sequence number continues its rank's lines, every line's own
  number is the one expected, metric steps increase, and each rank's line count equals what its
  fake agent sent (checked in a sink on the bus, so the bus's delivery order is checked too);
- console RSS (peak) and console CPU per second during steady streaming.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / ".dev"))

from mscon.agent import protocol as P  # noqa: E402

FILLER = "x" * 40
SSH_WINDOW = 2 * 2**20  # asyncssh's default channel window: unread output a node can have waiting
HOST = "127.0.0.1"  # what the fake agents' Hello gives as ssh_addr: the scheduler's address


# =============================================================================== the fake agents


@dataclass
class SimRank:
    name: str
    rank: int
    seq: int = 0  # log lines sent
    step: int = 0
    owed: float = 0.0  # lines due but not yet sent (fractional rate, or a full socket)
    steps_owed: float = 0.0
    alive: bool = True


@dataclass
class SimNode:
    name: str
    writer: asyncio.StreamWriter
    ranks: list[SimRank] = field(default_factory=list)
    running: bool = False
    flush_s: float = 0.1
    stop_ns: int | None = None  # when the first Stop arrived (this worker's clock)
    held_back: int = 0  # flushes skipped because the console had not read the last ones
    sub: Any = None  # the console's Subscribe (None: every line and metric, as before protocol 9)
    last_summary: float = 0.0
    latest: dict[str, P.Metric] = field(default_factory=dict)  # per rank, since the last summary


class Worker:
    """One process, many fake agents: an asyncio server on a Unix socket, one connection per node."""

    def __init__(self, lines_per_s: float, steps_per_s: float, single_metrics: bool) -> None:
        self.lines_per_s = lines_per_s
        self.steps_per_s = steps_per_s
        self.single_metrics = single_metrics
        self.nodes: dict[str, SimNode] = {}
        self.pid = itertools_count()
        # Nodes that read a Stop, waiting for their final flush and exits: done one node at a time
        # between reads, so that a worker's 2,500 agents (each on a node of its own, really) read
        # their Stops as the console writes them, not each after the others' final flushes.
        self.stopping: collections.deque[SimNode] = collections.deque()
        self.stopper: asyncio.Task[None] | None = None

    async def serve(self, path: str) -> None:
        server = await asyncio.start_unix_server(self._conn, path=path, limit=64 * 2**20)
        ticker = asyncio.get_running_loop().create_task(self._ticker())
        async with server:
            await server.serve_forever()
        ticker.cancel()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readline()).decode().split()
        if head[:1] == ["control"]:
            await self._control(reader, writer)
            return
        name = head[1]
        node = self.nodes[name] = SimNode(name, writer)
        self._send(
            node,
            P.Hello(
                node=name,
                protocol=P.PROTOCOL_VERSION,
                pid=next(self.pid),
                hostname=name,
                python="3.11",
                platform="sim",
                ssh_addr=HOST,
            ),
        )
        try:
            while line := await reader.readline():
                self._handle(node, P.decode(line.decode()))
        except (ConnectionError, OSError):
            pass
        node.running = False
        with contextlib.suppress(Exception):
            writer.close()

    def _send(self, node: SimNode, *msgs: P.Message) -> None:
        if not node.writer.is_closing():
            node.writer.write("".join(P.encode(m) for m in msgs).encode())

    def _handle(self, node: SimNode, msg: P.Message) -> None:
        if isinstance(msg, P.Start):
            node.flush_s = msg.flush_interval_s
            node.ranks = [SimRank(s.name, s.rank) for s in msg.procs]
            now = time.time_ns()
            self._send(
                node,
                *(
                    P.ProcStarted(
                        node=node.name,
                        name=r.name,
                        rank=r.rank,
                        pid=next(self.pid),
                        ts_ns=now,
                        log_path=f"/sim/{node.name}/{r.name}.log",
                    )
                    for r in node.ranks
                ),
            )
            node.running = True
        elif isinstance(msg, P.Stop):
            if node.stop_ns is None:
                node.stop_ns = time.time_ns()
            self.stopping.append(node)
            if self.stopper is None or self.stopper.done():
                self.stopper = asyncio.get_running_loop().create_task(self._stop_each())
        elif isinstance(msg, P.Subscribe):
            node.sub = msg
        elif isinstance(msg, P.Shutdown):
            node.running = False
            node.writer.close()

    async def _stop_each(self) -> None:
        while self.stopping:
            self._stop(self.stopping.popleft())
            await asyncio.sleep(0)  # the other agents read meanwhile

    def _stop(self, node: SimNode) -> None:
        """What an agent does on a Stop: its ranks' last lines, its last summary, their exits."""
        self._flush(node, final=True)
        self._summary(node, force=True)
        out: list[P.Message] = []
        for r in node.ranks:
            if r.alive:
                r.alive = False
                out.append(_exited(node.name, r, None, "SIGTERM", 15, by_agent=True))
        if node.running:
            out.append(P.AllExited(node=node.name, ts_ns=time.time_ns()))
        node.running = False
        self._send(node, *out)

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            cmd = line.decode().split()
            if cmd[0] == "kill":  # kill NODE RANK: the rank dies by SIGKILL, its agent reports at once
                node = self.nodes[cmd[1]]
                r = next(r for r in node.ranks if r.name == cmd[2])
                self._flush(node, final=True)
                r.alive = False
                msg = _exited(node.name, r, None, "SIGKILL", 9, by_agent=False)
                self._send(node, msg)
                writer.write(f"{msg.ts_ns}\n".encode())
            elif cmd[0] == "fetch":  # fetch NODE: the lines its ranks' log files hold (all of them)
                node = self.nodes[cmd[1]]
                writer.write(json.dumps({r.name: r.seq for r in node.ranks}).encode() + b"\n")
            elif cmd[0] == "report":
                report = {
                    n.name: {
                        "stop_ns": n.stop_ns,
                        "held_back": n.held_back,
                        "sent": {r.name: r.seq for r in n.ranks},
                        "steps": {r.name: r.step for r in n.ranks},
                    }
                    for n in self.nodes.values()
                }
                writer.write(json.dumps(report).encode() + b"\n")
            await writer.drain()
        writer.close()

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        tick = 0.1
        start = loop.time()
        n = 0
        parent = os.getppid()
        while True:
            n += 1
            await asyncio.sleep(max(0.0, start + n * tick - loop.time()))
            if os.getppid() != parent:  # the console is gone: so are its agents
                os._exit(0)
            for i, node in enumerate(list(self.nodes.values())):
                if i % 100 == 99:
                    await asyncio.sleep(0)  # each agent has a node of its own: the others read meanwhile
                if node.running:
                    self._accrue(node, tick)
                    self._flush(node)
                    self._summary(node)
                    # The agent samples CPU and memory once a second; subscribed, it sends them
                    # once a summary tick (agent/streaming.py's _telemetry).
                    if n % 10 == 0 and (node.sub is None or n % round(10 * node.sub.tick_s) == 0):
                        self._telemetry(node)

    def _telemetry(self, node: SimNode) -> None:
        ts = time.time()
        items = [
            P.Telemetry(node=node.name, name=r.name, rank=r.rank, cpu_percent=99.0, rss_bytes=2**30, ts=ts)
            for r in node.ranks
            if r.alive
        ]
        if self.single_metrics:
            self._send(node, *items)
        elif items:
            self._send(node, P.message_class("telemetry_batch")(node=node.name, items=tuple(items)))  # type: ignore[call-arg]

    def _summary(self, node: SimNode, force: bool = False) -> None:
        """A subscribed agent's NodeSummary every tick_s (agent/streaming.py's _summary_tick)."""
        sub = node.sub
        now = time.monotonic()
        if sub is None or (not force and now - node.last_summary < sub.tick_s):
            return
        node.last_summary = now
        counts = tuple(P.RankCount(r.name, r.rank, r.seq, r.step) for r in node.ranks)
        metrics = tuple(node.latest.values())
        node.latest.clear()
        self._send(node, P.NodeSummary(node=node.name, ts=time.time(), counts=counts, metrics=metrics))

    def _accrue(self, node: SimNode, dt: float) -> None:
        for r in node.ranks:
            if r.alive and r.rank >= 0:  # the scheduler prints nothing
                r.owed += self.lines_per_s * dt
                r.steps_owed += self.steps_per_s * dt

    def _flush(self, node: SimNode, final: bool = False) -> None:
        """What the real agent's _flush does each interval: one LogBatch, one MetricBatch per rank."""
        transport = node.writer.transport
        if not final and transport is not None and transport.get_write_buffer_size() > 2**20:
            node.held_back += 1  # the console is behind: lines wait in the "files"
            return
        now_ns = time.time_ns()
        out: list[P.Message] = []
        for r in node.ranks:
            if not r.alive:
                continue
            lines: list[str] = []
            metrics: list[P.Metric] = []
            while r.steps_owed >= 1.0 and r.owed >= 1.0:  # a step: its loss line first
                r.steps_owed -= 1.0
                r.owed -= 1.0
                r.step += 1
                loss = 2.5 * 0.999**r.step
                lines.append(f"epoch: 1 step: {r.step}, loss is {loss:.6f}")
                metrics.append(
                    P.Metric(
                        node=node.name,
                        name=r.name,
                        rank=r.rank,
                        step=r.step,
                        loss=loss,
                        epoch=1,
                        ts=now_ns / 1e9,
                        source="parsed",
                    )
                )
            k = int(r.owed)
            if k:
                r.owed -= k
                base = r.seq + len(lines)
                lines += [f"{r.name} line {base + i} {FILLER}" for i in range(k)]
            wanted = node.sub is None or node.sub.wants(r.rank)
            if lines and wanted:
                out.append(
                    P.LogBatch(
                        node=node.name, name=r.name, rank=r.rank, seq=r.seq, lines=tuple(lines), ts_ns=now_ns
                    )
                )
            r.seq += len(lines)  # in its log file on the node, sent or not
            if metrics and node.sub is not None and not node.sub.every_metric:
                node.latest[r.name] = metrics[-1]  # the next summary carries it
            elif metrics:
                if self.single_metrics:
                    out.extend(metrics)
                else:
                    out.append(metric_batch(metrics))
        if out:
            self._send(node, *out)


def metric_batch(metrics: list[P.Metric]) -> P.Message:
    cls = P.message_class("metrics")
    m = metrics[0]
    return cls(node=m.node, name=m.name, rank=m.rank, metrics=tuple(metrics))  # type: ignore[call-arg]


def _exited(
    node: str, r: SimRank, code: int | None, sig: str | None, signum: int | None, by_agent: bool
) -> P.ProcExited:
    return P.ProcExited(
        node=node,
        name=r.name,
        rank=r.rank,
        pid=0,
        exitcode=code,
        signal=sig,
        signum=signum,
        ts_ns=time.time_ns(),
        stopped_by_agent=by_agent,
        tail=(f"{r.name} last line",),
    )


def itertools_count() -> Any:
    import itertools

    return itertools.count(1000)


def worker_main(path: str, lines_per_s: float, steps_per_s: float, single: bool) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(Worker(lines_per_s, steps_per_s, single).serve(path))
    return 0


# =============================================================================== the console side


def console_imports() -> None:
    global AgentChannel, NodeTransport, Supervisor, RunOptions, EventBus, HeadlessReporter  # noqa: PLW0603
    global load_inventory, AgentEvent, NodeUpdate, NodeState, Stopping, LINE_LIMIT  # noqa: PLW0603
    global TransportKind, default_lines, parse_ranks, FreezeAfterSlowPasses, stream_line_ready  # noqa: PLW0603
    from mscon.console.config.inventory import load_inventory
    from mscon.console.engine.bus import EventBus
    from mscon.console.engine.collector import FreezeAfterSlowPasses
    from mscon.console.engine.events import AgentEvent, NodeState, NodeUpdate, Stopping
    from mscon.console.engine.lines_wanted import default_lines, parse_ranks
    from mscon.console.engine.supervisor import RunOptions, Supervisor
    from mscon.console.transport import AgentChannel, NodeTransport, TransportKind
    from mscon.console.transport.base import LINE_LIMIT, stream_line_ready
    from mscon.console.views.headless.reporter import HeadlessReporter


def allow_nodes(n: int, ranks: int) -> None:
    """The inventory refuses more than limits.MAX_NODES nodes (16,384) and MAX_WORLD_SIZE ranks
    (131,072); a bench past them lifts the caps in this process only, and says so."""
    from mscon.console.config import schema

    if n > schema.MAX_NODES:
        print(f"(bench: the inventory's cap of {schema.MAX_NODES} nodes lifted to {n} in this process)")
        schema.MAX_NODES = n
    if ranks > schema.MAX_WORLD_SIZE:
        print(f"(bench: the cap of {schema.MAX_WORLD_SIZE} ranks lifted to {ranks} in this process)")
        schema.MAX_WORLD_SIZE = ranks


def make_classes(
    stop_sent: dict[str, int], connect_s: float, sockets: list[str], fetched: dict[str, int]
) -> Callable[..., Any]:
    """The transport factory: SimTransport per node; node i talks to worker i % len(sockets)."""

    class SimChannel(AgentChannel):  # type: ignore[misc,valid-type]
        def __init__(self, node: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.node, self.reader, self.writer = node, reader, writer

        async def _write(self, data: str) -> None:
            self.send_now(data)
            await self.writer.drain()

        def send_now(self, line: str) -> bool:
            self.writer.write(line.encode())
            if line.startswith('{"type":"stop"') and self.node not in stop_sent:
                stop_sent[self.node] = time.time_ns()
            return True

        async def _readline(self) -> str:
            return (await self.reader.readline()).decode("utf-8", errors="replace")

        def _line_ready(self) -> bool:
            return stream_line_ready(self.reader)

        async def close(self, wait_s: float = 10.0) -> None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.writer.wait_closed(), wait_s)

        def _stderr_raw(self) -> str:
            return ""

    class SimTransport(NodeTransport):  # type: ignore[misc,valid-type]
        kind = TransportKind.SSH  # it stands in for SSH nodes

        def __init__(self, node: Any, ssh: Any, index: int) -> None:
            super().__init__(node)
            self.ssh = ssh
            self.socket = sockets[index % len(sockets)]

        async def connect(self) -> None:
            sem = self.ssh.connect_semaphore
            async with sem if sem is not None else contextlib.nullcontext():
                await asyncio.sleep(connect_s)  # the handshake and deploy of a real node

        async def ensure_agent(self, bundle: Any) -> str:
            self.home = "/sim"  # what a real transport learns on the node: the run folders' root
            return "/sim/agent"

        async def upload_workdir(self, archive: Any) -> str:
            raise NotImplementedError

        @property
        def syncs_workdir(self) -> bool:
            return False

        async def start_agent(self, agent_dir: str, python: str) -> Any:
            # Reading pauses at 2 x limit buffered, as an SSH channel's stops at its window
            # (asyncssh's default: 2 MiB): what a console behind holds per node, not more.
            reader, writer = await asyncio.open_unix_connection(self.socket, limit=SSH_WINDOW // 2)
            writer.write(f"node {self.node.name}\n".encode())
            return SimChannel(self.node.name, reader, writer)

        async def fetch_run_dir(self, remote: str, local: str, logs_root: str | None = None, **_: Any) -> int:
            # The fetch at the end: the lines the node's log files hold (counted, not copied). A
            # few at a time, as SSH connections are: thousands at once overflow a worker's backlog.
            async with fetch_slots:
                reader, writer = await asyncio.open_unix_connection(self.socket, limit=LINE_LIMIT)
                writer.write(f"control\nfetch {self.node.name}\n".encode())
                fetched.update(json.loads(await reader.readline()))
                writer.close()
            return 0

        async def holds_run(self, run_id: str) -> bool:
            return False  # simulated nodes keep no run folders

        async def close(self) -> None:
            return None

    index: dict[str, int] = {}
    fetch_slots = asyncio.Semaphore(32)

    def factory(inv: Any, node: Any, ssh: Any) -> Any:
        i = index.setdefault(node.name, len(index))
        return SimTransport(node, ssh, i)

    return factory


class Checker:
    """A bus sink: per-rank order and completeness of what the console delivers to its views."""

    def __init__(self) -> None:
        self.next_seq: dict[str, int] = {}
        self.last_step: dict[str, int] = {}
        self.problems: list[str] = []
        self.lines = 0
        self.metrics = 0
        self.batches = 0
        self.cpu_s = 0.0
        self.messages = 0  # agent messages of any kind
        self.summaries = 0
        self.node_lines: dict[str, int] = {}  # per rank: lines its node counted (NodeSummary)

    def handle(self, ev: Any) -> None:
        t = time.perf_counter()
        self._handle(ev)
        self.cpu_s += time.perf_counter() - t  # the check is the bench's cost, not the console's

    def _handle(self, ev: Any) -> None:
        if not isinstance(ev, AgentEvent):
            return
        self.messages += 1
        msg = ev.msg
        if isinstance(msg, P.LogBatch):
            self.batches += 1
            want = self.next_seq.get(msg.name, 0)
            if msg.seq != want:
                self._problem(f"{msg.name}: batch at line {msg.seq}, expected {want}")
            seq = msg.seq
            for i, line in enumerate(msg.lines):
                if not line.startswith("epoch") and int(line.split(" ", 3)[2]) != seq + i:
                    self._problem(f"{msg.name}: line {seq + i} reads {line[:40]!r}")
                    break
            self.next_seq[msg.name] = seq + len(msg.lines)
            self.lines += len(msg.lines)
        else:
            if isinstance(msg, P.NodeSummary):
                self.summaries += 1
                for c in msg.counts:
                    if c.lines < self.node_lines.get(c.name, 0):
                        before = self.node_lines[c.name]
                        self._problem(f"{c.name}: its node counted {c.lines} lines after {before}")
                    self.node_lines[c.name] = c.lines
            for m in metrics_of(msg):
                self.metrics += 1
                if m.step <= self.last_step.get(m.name, 0):
                    self._problem(f"{m.name}: step {m.step} after {self.last_step[m.name]}")
                self.last_step[m.name] = m.step

    def _problem(self, text: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(text)


def metrics_of(msg: P.Message) -> tuple[P.Metric, ...]:
    if isinstance(msg, P.Metric):
        return (msg,)
    return getattr(msg, "metrics", ()) if msg.type in ("metrics", "summary") else ()


@dataclass
class Result:
    nodes: int
    ranks: int
    agents_up_s: float = math.nan
    started_s: float = math.nan
    start_cpu_s: float = math.nan
    stream_cpu: float = math.nan  # console cores while streaming
    stream_lines_s: float = math.nan
    stream_msgs_s: float = math.nan
    kill_to_stopping_s: float = math.nan  # the console has seen the exit and decided to stop
    kill_to_stop_sent_s: float = math.nan
    kill_to_stop_recv_s: float = math.nan
    stopped_nodes: int = 0
    rss_mib: float = math.nan
    maxrss_mib: float = math.nan
    exit_code: int = -1
    lines: int = 0  # streamed to the console (the subscribed ranks')
    metrics: int = 0
    node_lines: int = 0  # written on the nodes (every rank's)
    fetched_lines: int = 0  # in the fetch at the end
    summaries: int = 0
    dropped: int = 0  # samples the console dropped while behind (console/engine/inputs.py)
    held_back: int = 0
    problems: list[str] = field(default_factory=list)


async def run_console(a: argparse.Namespace, n_nodes: int, tmp: Path, sockets: list[str]) -> Result:
    import psutil

    inv_path = tmp / f"scale-{n_nodes}.yaml"
    (tmp / "train.py").write_text("print('never run: the agents are simulated')\n")
    nodes = "".join(
        f"  - {{host: 10.0.{i // 256}.{i % 256}, name: n{i:04d}, devices: {a.ranks_per_node}}}\n"
        for i in range(n_nodes)
    )
    inv_path.write_text(
        "name: scale\ndevice_target: CPU\ndefaults: {python: /usr/bin/python3}\nnodes:\n"
        + nodes
        + "scheduler: {port: 8118}\n"
        + f"job: {{workdir: {tmp}, script: train.py}}\n"
        + f"ssh: {{max_parallel_connects: {a.parallel}}}\nstop: {{grace_s: 3}}\n"
    )
    inv = load_inventory(inv_path)
    res = Result(n_nodes, inv.world_size)
    stop_sent: dict[str, int] = {}
    fetched: dict[str, int] = {}
    factory = make_classes(stop_sent, a.connect_ms / 1000, sockets, fetched)
    bus = EventBus()
    devnull = open(os.devnull, "w")  # noqa: SIM115
    reporter = HeadlessReporter(out=devnull, err=devnull, quiet_states=True)
    checker = Checker()
    bus.add_sink("reporter", reporter.handle)
    # Never lags into dropping metrics (what the order check sees is all there is); the reporter
    # keeps the default limits, as in `mscon run`.
    bus.add_sink("checker", checker.handle, lag_limit=10**9, hard_limit=10**9)
    procs = n_nodes * a.ranks_per_node + 1
    marks: dict[str, float] = {}
    cpu0 = time.process_time()
    t0 = time.monotonic()

    class Timed(Supervisor):  # type: ignore[misc,valid-type]
        started = 0
        ready = 0

        def emit(self, ev: Any) -> None:
            super().emit(ev)
            if isinstance(ev, AgentEvent) and isinstance(ev.msg, P.ProcStarted):
                self.started += 1
                if self.started == procs:
                    marks["started"] = time.monotonic()
                    marks["started_cpu"] = time.process_time()
            elif isinstance(ev, NodeUpdate) and ev.state is NodeState.READY:
                self.ready += 1
                if self.ready == n_nodes:
                    marks["agents_up"] = time.monotonic()
            elif isinstance(ev, Stopping):
                marks.setdefault("stopping_ns", time.time_ns())

    options = RunOptions(run_id=f"scale-{n_nodes}-{os.getpid()}", logs_root=tmp / "runs")
    sup = Timed(inv, options, bus, transport_factory=factory)
    # As `mscon run --no-tui [--lines RANKS]` does (console/cli/main.py); --lines old: no Subscribe.
    wanted: frozenset[int] | None = None
    if a.lines != "old":
        wanted = default_lines(inv.world_size) if a.lines is None else parse_ranks(a.lines)
        sup.want_lines("headless", wanted)
    proc = psutil.Process()
    peak = 0

    async def driver() -> int:
        nonlocal peak
        while "started" not in marks:
            await asyncio.sleep(0.05)
            peak = max(peak, proc.memory_info().rss)
        await asyncio.sleep(min(2.0, a.seconds / 3))  # settle, then measure steady streaming
        phases = None
        if a.profile_phases:
            phases = cProfile.Profile()
            phases.enable()
        c1, w1, l1, b1 = (
            time.process_time() - checker.cpu_s,
            time.monotonic(),
            checker.lines,
            checker.messages,
        )
        end = time.monotonic() + a.seconds
        while time.monotonic() < end:
            await asyncio.sleep(0.25)
            peak = max(peak, proc.memory_info().rss)
        c2, w2, l2, b2 = (
            time.process_time() - checker.cpu_s,
            time.monotonic(),
            checker.lines,
            checker.messages,
        )
        if phases is not None:
            phases.disable()
            phases.dump_stats(f"{a.profile_phases}-{n_nodes}-steady.pstats")
            phases = cProfile.Profile()
            phases.enable()  # from just before the kill to the last Stop written
        res.stream_cpu = (c2 - c1) / (w2 - w1)
        res.stream_lines_s = (l2 - l1) / (w2 - w1)
        res.stream_msgs_s = (b2 - b1) / (w2 - w1)
        victim = n_nodes // 2
        reader, writer = await asyncio.open_unix_connection(sockets[victim % len(sockets)])
        writer.write(f"control\nkill n{victim:04d} r{victim * a.ranks_per_node + 3}\n".encode())
        await writer.drain()
        kill_ns = int((await reader.readline()).decode())
        writer.close()
        if phases is not None:
            while len(stop_sent) < n_nodes and time.monotonic() < end + 60:  # noqa: ASYNC110 - the bench's poll
                await asyncio.sleep(0.01)
            phases.disable()
            phases.dump_stats(f"{a.profile_phases}-{n_nodes}-kill.pstats")
        return kill_ns

    drive = asyncio.get_running_loop().create_task(driver())
    collector = FreezeAfterSlowPasses()  # as `mscon run --no-tui` does (console/cli/main.py)
    collector.install()
    try:
        result = await sup.run()
    finally:
        collector.uninstall()
    kill_ns = await drive if drive.done() else None
    if not drive.done():
        drive.cancel()
    res.exit_code = result.exit_code
    res.rss_mib = proc.memory_info().rss / 2**20
    res.maxrss_mib = max(peak, proc.memory_info().rss) / 2**20
    res.maxrss_mib = max(res.maxrss_mib, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if "agents_up" in marks:
        res.agents_up_s = marks["agents_up"] - t0
    if "started" in marks:
        res.started_s = marks["started"] - t0
        res.start_cpu_s = marks["started_cpu"] - cpu0
    reports: dict[str, Any] = {}
    for path in sockets:
        reader, writer = await asyncio.open_unix_connection(path, limit=LINE_LIMIT)
        writer.write(b"control\nreport\n")
        reports.update(json.loads(await reader.readline()))
        writer.close()
    res.lines, res.metrics = checker.lines, checker.metrics
    res.problems = list(checker.problems)
    res.held_back = sum(r["held_back"] for r in reports.values())
    res.summaries = checker.summaries
    res.dropped = sup._inputs.dropped if sup._inputs is not None else 0
    sent_total = streamed_total = 0
    for node, rep in reports.items():
        for name, sent in rep["sent"].items():
            sent_total += sent
            rank = P.rank_of(name)
            if wanted is None or rank in wanted:  # subscribed from the start: every line streamed
                streamed_total += sent
                got = checker.next_seq.get(name, 0)
                if got != sent:
                    res.problems.append(f"{node} {name}: {sent} lines written, {got} streamed")
            if fetched.get(name) != sent:  # nothing lost: every line on the node is fetched
                res.problems.append(f"{node} {name}: {sent} lines written, {fetched.get(name)} fetched")
            # A summary dropped while the console was behind (the next supersedes it) may have been
            # the last: then the last step delivered can be short of the last sent.
            if rep["steps"][name] != checker.last_step.get(name, 0) and not res.dropped:
                res.problems.append(
                    f"{node} {name}: {rep['steps'][name]} steps sent, "
                    f"last delivered {checker.last_step.get(name, 0)}"
                )
    res.node_lines, res.fetched_lines = sent_total, sum(fetched.values())
    if streamed_total != checker.lines:
        res.problems.append(f"{streamed_total} lines of subscribed ranks written, {checker.lines} streamed")
    if kill_ns is not None:
        recv = [r["stop_ns"] for r in reports.values() if r["stop_ns"] is not None]
        res.stopped_nodes = len(recv)
        if "stopping_ns" in marks:
            res.kill_to_stopping_s = (marks["stopping_ns"] - kill_ns) / 1e9
        if len(stop_sent) == n_nodes:
            res.kill_to_stop_sent_s = (max(stop_sent.values()) - kill_ns) / 1e9
        if len(recv) == n_nodes:
            res.kill_to_stop_recv_s = (max(recv) - kill_ns) / 1e9
    else:
        res.problems.append("the run ended before the kill")
    devnull.close()
    return res


def start_workers(
    a: argparse.Namespace, n_nodes: int, tmp: Path
) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    count = max(1, min(a.max_workers, math.ceil(n_nodes / a.nodes_per_worker)))
    procs, sockets = [], []
    env = dict(os.environ, PYTHONPATH=str(REPO / ".dev"))
    for i in range(count):
        path = str(tmp / f"w{n_nodes}-{i}.sock")
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            path,
            "--lines-per-s",
            str(a.lines_per_s),
            "--steps-per-s",
            str(a.steps_per_s),
        ] + (["--single-metrics"] if a.single_metrics else [])
        procs.append(subprocess.Popen(cmd, env=env))
        sockets.append(path)
    deadline = time.monotonic() + 20
    while not all(os.path.exists(s) for s in sockets):
        if time.monotonic() > deadline:
            raise RuntimeError("fake agent workers did not start")
        time.sleep(0.05)
    return procs, sockets


def fmt(v: float, spec: str = ".2f") -> str:
    return "-" if math.isnan(v) else format(v, spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 10, 100, 1000])
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0, help="steady streaming before the kill")
    p.add_argument("--lines-per-s", type=float, default=2.0, help="log lines per rank per second")
    p.add_argument(
        "--steps-per-s", type=float, default=1.0, help="steps (loss lines, metrics) per rank per second"
    )
    p.add_argument(
        "--connect-ms", type=float, default=100.0, help="simulated SSH handshake + deploy per node"
    )
    p.add_argument("--parallel", type=int, default=64, help="ssh.max_parallel_connects")
    p.add_argument("--nodes-per-worker", type=int, default=250)
    p.add_argument("--max-workers", type=int, default=4)
    p.add_argument("--single-metrics", action="store_true", help="one Metric message per step (the old way)")
    p.add_argument(
        "--lines",
        help="ranks whose lines stream (as mscon run --lines: 0,3,8-15, all, none); default as mscon run; "
        "'old': no Subscribe (every line and metric streams, protocol 8's way)",
    )
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--profile", help="cProfile the console into PREFIX-N.pstats")
    p.add_argument(
        "--profile-phases",
        help="cProfile the console's steady streaming into PREFIX-N-steady.pstats, and from the kill to the "
        "last Stop written into PREFIX-N-kill.pstats",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker_main(a.worker, a.lines_per_s, a.steps_per_s, a.single_metrics)
    console_imports()
    allow_nodes(max(a.nodes), max(a.nodes) * a.ranks_per_node + 1)
    print(
        f"{a.ranks_per_node} ranks/node, {a.lines_per_s:g} lines/s and {a.steps_per_s:g} steps/s per rank, "
        f"{'Metric per step' if a.single_metrics else 'MetricBatch per flush'}, connect {a.connect_ms:g} ms "
        f"x {a.parallel} in parallel, {a.seconds:g} s streaming; {os.cpu_count()} cores",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="mscon-scale-") as td:
        tmp = Path(td)
        for n in a.nodes:
            workers, sockets = start_workers(a, n, tmp)
            try:
                if a.profile:
                    prof = cProfile.Profile()
                    res = prof.runcall(asyncio.run, run_console(a, n, tmp, sockets))
                    prof.dump_stats(f"{a.profile}-{n}.pstats")
                else:
                    res = asyncio.run(run_console(a, n, tmp, sockets))
            finally:
                for w in workers:
                    w.terminate()
                for w in workers:
                    w.wait()
            results.append(res)
            verdict = "in order, none lost" if not res.problems else "; ".join(res.problems[:5])
            print(
                f"N={n}: exit {res.exit_code}, {res.node_lines:,} lines on the nodes, {res.fetched_lines:,} "
                f"fetched, {res.lines:,} streamed, {res.metrics:,} metrics and {res.summaries:,} summaries "
                f"delivered ({res.dropped:,} samples dropped while behind): "
                f"{verdict}; {res.stopped_nodes}/{n} agents got Stop; {res.held_back} flushes held back; "
                f"kill -> stop decided {fmt(res.kill_to_stopping_s, '.3f')} s",
                flush=True,
            )
    print()
    print(
        f"{'nodes':>6} {'ranks':>6} {'agents up s':>11} {'all started s':>13} {'start CPU s':>11} "
        f"{'lines/s':>8} {'msgs/s':>7} {'CPU core':>8} {'kill->Stop sent':>15} {'->received':>10} "
        f"{'RSS MiB':>8} {'ok':>3}"
    )
    for r in results:
        print(
            f"{r.nodes:>6} {r.ranks:>6} {fmt(r.agents_up_s):>11} {fmt(r.started_s):>13} "
            f"{fmt(r.start_cpu_s):>11} "
            f"{fmt(r.stream_lines_s, ',.0f'):>8} {fmt(r.stream_msgs_s, ',.0f'):>7} {fmt(r.stream_cpu):>8} "
            f"{fmt(r.kill_to_stop_sent_s, '.3f'):>15} {fmt(r.kill_to_stop_recv_s, '.3f'):>10} "
            f"{fmt(r.maxrss_mib, '.0f'):>8} {'yes' if not r.problems else 'NO':>3}"
        )
    if a.json:
        a.json.write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0 if all(not r.problems for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
