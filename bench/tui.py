"""Console benchmark: the TUI under 64, 256 and 1,024 ranks, each sending 2 metric updates and 20 log
lines a second (the agent batches lines every 0.1 s, so 10 log batches per rank per second).

    PYTHONPATH=.dev .venv/bin/python bench/tui.py [--ranks 64 256 1024] [--seconds 15] [--burst]
    .venv/bin/python bench/tui.py --nodes 10000 --ranks-per-node 8 --lines-per-s 2 --metrics-per-s 1 \
        --screen overview --type "node n0012" "state:run"

1,024 real processes are too many for a 2-core machine, so the events come from a synthetic source
that does what the supervisor does with an agent's messages (ClusterState.apply, then the EventBus,
whose "tui" sink is the console's buffer) at the rates above, each node's agent (64 ranks) in turn
over the 0.1 s (``--burst``: all at once). The app runs headless (the compositor renders every
frame; only the terminal write is skipped) on the Devices screen (panes up to 16 ranks, the table
above). Reported: CPU of the whole process as a fraction of one core, and of the
view alone (minus the synthetic engine, measured on its own); event arrival (the engine's receipt,
so the bus queue and the wait for a flush count) -> paint, and flush start -> paint (p50/p99);
resident memory.

What arrives is what a protocol-9 console gets (``--feed summaries``, the default), by the rules of
console/engine/lines_wanted.py at the run's size: the log lines of the ranks the TUI shows by default
only (every rank's up to 64 ranks, rank 0's beyond), every metric as a MetricBatch up to 1,024 ranks,
and one NodeSummary (each rank's counts; beyond 1,024 ranks its latest metric too) and one
TelemetryBatch per node and summary tick (1 s up to 1,000 nodes, 10 s at 10,000), the nodes' ticks
spread over the tick. ``--feed every-line``: every rank's lines and metrics (an unsubscribed agent,
the figures before protocol 9).

``--type QUERY ...``: after the flush measurement, under the same load, the filter box is opened
with ``/`` and each query typed key by key, then erased with backspace, again and again for
``--typing-seconds``; each keystroke's time from the key press to the paint of its refresh is a
figure of its own (p50/p99).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".dev"))

from mscon.agent.protocol import (  # noqa: E402
    LogBatch,
    Metric,
    MetricBatch,
    NodeSummary,
    ProcStarted,
    RankCount,
    Telemetry,
    TelemetryBatch,
)
from mscon.console.engine.bus import EventBus  # noqa: E402
from mscon.console.engine.events import (  # noqa: E402
    AgentEvent,
    AttemptStarted,
    Event,
    NodeState,
    NodeUpdate,
    RankRef,
    RunStarted,
)
from mscon.console.engine.lines_wanted import (  # noqa: E402
    EVERY_METRIC_UP_TO,
    default_lines,
    summary_tick_s,
)
from mscon.console.views.tui.app import MsconApp  # noqa: E402
from mscon.console.views.tui.feed import Changes  # noqa: E402
from mscon.console.views.tui.source import TUI_HARD_LIMIT, TUI_LAG_LIMIT, Handler, Source  # noqa: E402
from mscon.console.views.tui.textual_compat import app_driver  # noqa: E402
from mscon.console.views.tui.widgets.rank_table import RankTable  # noqa: E402
from textual import events  # noqa: E402
from textual.keys import _character_to_key  # noqa: E402

BATCH_S = 0.1  # the agent's flush interval
LINES_PER_S = 20
METRICS_PER_S = 2
RANKS_PER_NODE = 64
RATES_QUERIES: list[str] = []  # --queries
RATES = {
    "lines": float(LINES_PER_S),
    "metrics": float(METRICS_PER_S),
    "ranks_per_node": float(RANKS_PER_NODE),
}  # per rank and second (options)


class _Forget(dict[int, float]):
    def __setitem__(self, key: int, value: float) -> None:
        pass


class SyntheticSource(Source):
    """The supervisor's emit (state.apply + bus.publish) fed by a generator at agent rates."""

    live = True

    def __init__(
        self,
        ranks: int,
        seconds: float,
        burst: bool = False,
        lines_per_s: float = LINES_PER_S,
        metrics_per_s: float = METRICS_PER_S,
        feed: str = "summaries",
    ) -> None:
        super().__init__()
        self.ranks = ranks
        self.lines_per_s = lines_per_s
        self.metrics_per_s = metrics_per_s
        self.seconds = seconds
        self.burst = burst  # every rank's batch at the same instant (else each node's agent in turn)
        self.feed = feed
        self.bus = EventBus()
        self.behind = 0  # ticks that started late (the machine could not keep up)
        self.emitted: dict[int, float] = {}  # id(event) -> perf_counter() when the engine got it

    def emit(self, ev: Event) -> None:
        self.emitted[id(ev)] = time.perf_counter()
        self.state.apply(ev)
        self.bus.publish(ev)

    async def _run(self, handler: Handler) -> int:
        if handler is not None:
            self.bus.add_sink("tui", handler, lag_limit=TUI_LAG_LIMIT, hard_limit=TUI_HARD_LIMIT)
        else:
            self.emitted = _Forget()
        names = [f"r{i}" for i in range(self.ranks)]
        rpn = int(RATES["ranks_per_node"])
        nodes = tuple(f"n{k:04d}" for k in range((self.ranks + rpn - 1) // rpn))
        node_of = [nodes[i // rpn] for i in range(self.ranks)]
        self.emit(RunStarted(0, "bench", "bench.yaml", nodes, self.ranks, "/tmp/bench"))
        now = time.time_ns()
        for node in nodes:  # connected and deployed, as a real run's nodes are once it streams
            self.emit(NodeUpdate(0, node, NodeState.READY, "agent up", now))
        self.emit(
            AttemptStarted(
                0, tuple(RankRef(n, node_of[i], i) for i, n in enumerate(names)), "127.0.0.1", 1, now
            )
        )
        for i, n in enumerate(names):
            self.emit(AgentEvent(0, ProcStarted(node_of[i], n, i, 1000 + i, now, f"/tmp/{n}.log")))
        if self.feed == "every-line":
            await self._every_line(names, node_of, rpn)
        else:
            await self._summaries(names, nodes, rpn)
        await self.bus.close()
        return 0

    def _metric(self, node: str, name: str, i: int, step: int, ts: float) -> Metric:
        slow = 2.0 if i == 1 else 1.0
        return Metric(node, name, i, step, 2.0 * 0.99**step, 1, 0.5 * slow, 64 / slow, ts, "metrics")

    async def _every_line(self, names: list[str], node_of: list[str], rpn: int) -> None:
        """Every rank's lines and metrics, each node's agent in turn over the 0.1 s (unsubscribed)."""
        # A rank prints a batch every `lines_every` flushes (each with `lines_per_batch` lines), a
        # metric every `metric_every`; one TelemetryBatch per node and second, as the agent does.
        lines_every = max(1, round(1 / (self.lines_per_s * BATCH_S)))
        lines_per_batch = max(1, round(self.lines_per_s * BATCH_S))
        metric_every = max(1, round(1 / (self.metrics_per_s * BATCH_S)))
        telemetry_every = round(1 / BATCH_S)
        filler = "x" * 60
        start = time.monotonic()
        tick = 0
        seq = [0] * self.ranks
        per_node = len(names) if self.burst else rpn
        while time.monotonic() - start < self.seconds:
            ts = time.time_ns()
            step = tick // metric_every
            for i, n in enumerate(names):
                if i and i % per_node == 0:  # the next node's agent: its batch comes a little later
                    slot = start + (tick + i / len(names)) * BATCH_S - time.monotonic()
                    await asyncio.sleep(max(0.0, slot))
                if i % rpn == 0 and tick % telemetry_every == 0:
                    node = node_of[i]
                    node_ranks = range(i, min(i + rpn, len(names)))
                    items = tuple(Telemetry(node, names[k], k, 95.0, 2**30, ts / 1e9) for k in node_ranks)
                    self.emit(AgentEvent(0, TelemetryBatch(node, items)))
                if (tick + i) % lines_every == 0:
                    lines = tuple(
                        f"rank {i} step {step} line {seq[i] + k} {filler}" for k in range(lines_per_batch)
                    )
                    self.emit(AgentEvent(0, LogBatch(node_of[i], n, i, seq[i], lines, ts)))
                    seq[i] += lines_per_batch
                if tick % metric_every == (i % metric_every):
                    metric = self._metric(node_of[i], n, i, step, ts / 1e9)
                    self.emit(AgentEvent(0, MetricBatch(node_of[i], n, i, (metric,))))
            tick += 1
            await self._next_tick(start, tick)

    async def _summaries(self, names: list[str], nodes: tuple[str, ...], rpn: int) -> None:
        """What a subscribed console gets (lines_wanted.py's rules at this size): the shown ranks'
        lines, every metric up to EVERY_METRIC_UP_TO ranks, and per node and summary tick one
        NodeSummary and one TelemetryBatch, the nodes' ticks spread evenly over the tick."""
        wanted = default_lines(self.ranks)
        shown = range(self.ranks) if wanted is None else sorted(r for r in wanted if r < self.ranks)
        every_metric = self.ranks <= EVERY_METRIC_UP_TO
        slots = max(1, round(summary_tick_s(len(nodes)) / BATCH_S))  # a node's summary every `slots` ticks
        lines_every = max(1, round(1 / (self.lines_per_s * BATCH_S)))
        lines_per_batch = max(1, round(self.lines_per_s * BATCH_S))
        metric_every = max(1, round(1 / (self.metrics_per_s * BATCH_S)))
        filler = "x" * 60
        parts = 1 if self.burst else 10  # the 0.1 s split in 10: the nodes' messages come in turn
        start = time.monotonic()
        tick = 0
        seq = [0] * self.ranks
        while time.monotonic() - start < self.seconds:
            ts = time.time_ns()
            step = tick // metric_every
            lines_so_far = int(tick * BATCH_S * self.lines_per_s)
            due = nodes[tick % slots :: slots]  # the nodes whose summary tick falls now
            for part in range(parts):
                if part:
                    await asyncio.sleep(max(0.0, start + (tick + part / parts) * BATCH_S - time.monotonic()))
                for i in shown[part::parts]:
                    n, node = names[i], nodes[i // rpn]
                    if (tick + i) % lines_every == 0:
                        lines = tuple(
                            f"rank {i} step {step} line {seq[i] + k} {filler}" for k in range(lines_per_batch)
                        )
                        self.emit(AgentEvent(0, LogBatch(node, n, i, seq[i], lines, ts)))
                        seq[i] += lines_per_batch
                    if every_metric and tick % metric_every == (i % metric_every):
                        metric = self._metric(node, n, i, step, ts / 1e9)
                        self.emit(AgentEvent(0, MetricBatch(node, n, i, (metric,))))
                for node in due[part::parts]:
                    first = int(node[1:]) * rpn
                    ranks = range(first, min(first + rpn, self.ranks))
                    counts = tuple(RankCount(names[k], k, max(seq[k], lines_so_far), step) for k in ranks)
                    latest = (self._metric(node, names[k], k, step, ts / 1e9) for k in ranks)
                    metrics = () if every_metric else tuple(latest)
                    self.emit(AgentEvent(0, NodeSummary(node, ts / 1e9, counts, metrics)))
                    items = tuple(Telemetry(node, names[k], k, 95.0, 2**30, ts / 1e9) for k in ranks)
                    self.emit(AgentEvent(0, TelemetryBatch(node, items)))
            tick += 1
            await self._next_tick(start, tick)

    async def _next_tick(self, start: float, tick: int) -> None:
        delay = start + tick * BATCH_S - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            self.behind += 1
            await asyncio.sleep(0)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def engine_only(ranks: int, seconds: float, burst: bool, feed: str) -> float:
    """CPU (fraction of a core) of the synthetic engine with a sink that drops everything."""
    src = SyntheticSource(ranks, seconds, burst, RATES["lines"], RATES["metrics"], feed)
    c0, t0 = time.process_time(), time.monotonic()
    src.start(lambda ev: None)
    await src.done.wait()
    return (time.process_time() - c0) / (time.monotonic() - t0)


KEY_GAP_S = 0.05  # between two keystrokes (after the last one was handled): a fast typist


async def type_queries(app: MsconApp, queries: list[str], seconds: float) -> list[tuple[float, float, str]]:
    """Type each query into the filter box key by key, then erase it, for ``seconds``: each
    keystroke's time from the press to the paint after the filter took it (the key handed to the
    driver as Pilot does, without its waits for the app to be idle: 0.1-1 s a key under the feed)."""
    took: list[tuple[float, float, str]] = []  # (wall, the loop thread's CPU) press -> paint; query
    pressed: list[tuple[float, float]] = []  # the keystroke not yet taken (one at a time)
    painted = asyncio.Event()
    model = app.model
    set_query = model.set_query

    def done(t: float, c: float, query: str) -> None:
        took.append((time.perf_counter() - t, time.thread_time() - c, query))
        painted.set()

    def taken(query: str) -> None:  # the filter box's change handler sets the query, then shows
        set_query(query)
        if pressed:
            app.main_screen.call_after_refresh(done, *pressed.pop(), model.query)

    model.set_query = taken  # type: ignore[method-assign]
    press(app, "/")
    box = app.main_screen.query_one("#filter")
    for _ in range(500):  # the keys go to the box once it has the focus
        if app.focused is box:
            break
        await asyncio.sleep(0.01)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            for query in queries:
                for key in [*query, *["backspace"] * len(query)]:
                    painted.clear()
                    pressed[:] = [(time.perf_counter(), time.thread_time())]
                    press(app, key)
                    await asyncio.wait_for(painted.wait(), 30)
                    await asyncio.sleep(KEY_GAP_S)
                    if time.monotonic() >= end:
                        break
    finally:
        model.set_query = set_query  # type: ignore[method-assign]
    press(app, "escape")
    return took


def press(app: MsconApp, key: str) -> None:
    """A key as the terminal driver hands it over: a character, or a named key ("backspace")."""
    if len(key) == 1:
        event = events.Key(key if key.isalnum() else _character_to_key(key), key)
    else:
        event = events.Key(key, None)
    event.set_sender(app)
    driver = app_driver(app)
    assert driver is not None
    driver.send_message(event)


async def with_console(
    ranks: int,
    seconds: float,
    warmup: float,
    screen: str,
    burst: bool,
    feed: str,
    typed: list[str],
    typing_s: float,
) -> dict[str, Any]:
    total = seconds + warmup + (typing_s + 2.0 if typed else 0.0)
    src = SyntheticSource(ranks, total, burst, RATES["lines"], RATES["metrics"], feed)
    refresh: dict[str, list[float]] = {}
    arrival_paint: list[float] = []
    flush_paint: list[float] = []
    flush_cpu: list[float] = []  # the loop thread's CPU from the flush's start to its paint
    cpu_at: dict[int, float] = {}  # id(changes) -> thread_time() when its flush began
    measuring = False

    def on_paint(ch: Changes, t_flush: float, t_paint: float) -> None:
        c0 = cpu_at.pop(id(ch), None)
        if measuring:
            flush_paint.append(t_paint - t_flush)
            arrival_paint.extend(t_paint - a for a in ch.arrivals)
            if c0 is not None:
                flush_cpu.append(time.thread_time() - c0)

    app = MsconApp(src, on_paint=on_paint, toasts=False)
    drain = app.feed.drain

    def timed_drain(limit: int = 200_000) -> Changes:
        c0 = time.thread_time()
        ch = drain(limit)
        if ch.events:
            cpu_at[id(ch)] = c0
        return ch

    app.feed.drain = timed_drain  # type: ignore[method-assign]
    sink = app.feed.handle
    pending = app.feed._pending

    def handle(ev: Event) -> None:  # arrival = when the engine got the event (the bus wait counts)
        sink(ev)
        t = src.emitted.pop(id(ev), None)
        if t is not None:
            pending[-1] = (t, ev)

    app.feed.handle = handle  # type: ignore[method-assign]
    proc = psutil.Process()
    async with app.run_test(size=(200, 60)) as pilot:
        if screen == "devices":
            await pilot.press("2")
        await asyncio.sleep(warmup / 2)
        # A whole-screen refresh, what each keystroke in the filter box (or a new sort) costs:
        # with no query, then each query of --queries (which then stays on while measuring).
        for query in ("", *RATES_QUERIES):
            app.model.set_query(query)
            for _ in range(5):
                t = time.perf_counter()
                await app.main_screen.show(None)
                refresh.setdefault(query, []).append(time.perf_counter() - t)
        await asyncio.sleep(warmup / 2)
        measuring = True
        c0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu = (time.process_time() - c0) / (time.monotonic() - t0)
        measuring = False
        shown = app.main_screen.query_one(RankTable).row_count
        rss = proc.memory_info().rss
        keys: list[tuple[float, float, str]] = []
        if typed:
            app.model.set_query("")
            keys = await type_queries(app, typed, typing_s)
        await src.done.wait()
        await pilot.pause(0.3)
        dropped = src.bus.dropped()
    return {
        "cpu": cpu,
        "a50": pct(arrival_paint, 0.5) * 1000,
        "a99": pct(arrival_paint, 0.99) * 1000,
        "f50": pct(flush_paint, 0.5) * 1000,
        "f99": pct(flush_paint, 0.99) * 1000,
        "c50": pct(flush_cpu, 0.5) * 1000,
        "c99": pct(flush_cpu, 0.99) * 1000,
        "paints": len(flush_paint),
        "k50": pct([k for k, _, _ in keys], 0.5) * 1000,
        "k99": pct([k for k, _, _ in keys], 0.99) * 1000,
        "kmax": max((k for k, _, _ in keys), default=float("nan")) * 1000,
        "kc50": pct([c for _, c, _ in keys], 0.5) * 1000,
        "kc99": pct([c for _, c, _ in keys], 0.99) * 1000,
        "kslow": sorted(keys, reverse=True)[:3],
        "keys": len(keys),
        "rss": rss / 2**20,
        "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "events": app.feed.total_events,
        "flushes": app.flushes,
        "behind": src.behind,
        "dropped": sum(n for _, n in dropped),
        "lines": sum(app.store.count(f"r{i}") for i in range(ranks)),
        "refresh": {q: pct(v, 0.5) * 1000 for q, v in refresh.items()},
        "shown": shown,
        "seconds": total,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--ranks", type=int, nargs="+", help="ranks (default 64 256 1024)")
    size.add_argument("--nodes", type=int, nargs="+", help="nodes, each of --ranks-per-node ranks")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--screen", choices=["devices", "overview"], default="devices")
    p.add_argument("--burst", action="store_true", help="every rank's batch at once (no node stagger)")
    p.add_argument(
        "--feed",
        choices=["summaries", "every-line"],
        default="summaries",
        help="what the console gets: a subscribed agent's (protocol 9) or every line and metric",
    )
    p.add_argument(
        "--queries", nargs="*", default=[], help="filters to time a whole refresh with (the last stays on)"
    )
    p.add_argument("--type", nargs="*", default=[], help="queries to type key by key in the filter box")
    p.add_argument("--typing-seconds", type=float, default=10.0, help="how long to go on typing them")
    p.add_argument("--ranks-per-node", type=int, default=RANKS_PER_NODE, help="ranks of one node's agent")
    p.add_argument("--lines-per-s", type=float, default=LINES_PER_S, help="log lines per rank per second")
    p.add_argument("--metrics-per-s", type=float, default=METRICS_PER_S, help="metrics per rank per second")
    a = p.parse_args()
    RATES["lines"], RATES["metrics"], RATES["ranks_per_node"] = (
        a.lines_per_s,
        a.metrics_per_s,
        a.ranks_per_node,
    )
    RATES_QUERIES.extend(a.queries)
    sizes = [n * a.ranks_per_node for n in a.nodes] if a.nodes else (a.ranks or [64, 256, 1024])
    os.environ.pop("NO_COLOR", None)
    print(
        f"{a.seconds:g} s per size after {a.warmup:g} s warm-up; screen: {a.screen}; feed: {a.feed}; "
        f"machine: {psutil.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}"
    )
    head = (
        f"{'ranks':>6} {'events/s':>9} {'cpu (core)':>10} {'view cpu':>9} {'arrive->paint p50/p99 ms':>25} "
        f"{'flush->paint p50/p99 ms':>24} {'rss MiB':>8} {'late ticks':>10} {'dropped':>8}"
    )
    print(head)
    for n in sizes:
        engine = asyncio.run(engine_only(n, min(a.seconds, 8.0), a.burst, a.feed))
        r = asyncio.run(
            with_console(n, a.seconds, a.warmup, a.screen, a.burst, a.feed, a.type, a.typing_seconds)
        )
        rate = r["events"] / r["seconds"]
        print(
            f"{n:>6} {rate:>9,.0f} {r['cpu']:>10.2f} {max(0.0, r['cpu'] - engine):>9.2f} "
            f"{r['a50']:>12.0f} / {r['a99']:<10.0f} {r['f50']:>11.1f} / {r['f99']:<10.1f} {r['rss']:>8.0f} "
            f"{r['behind']:>10} {r['dropped']:>8}",
            flush=True,
        )
        print(
            f"        flush->paint CPU of the loop thread, {r['paints']} paints: p50 {r['c50']:.1f} ms, "
            f"p99 {r['c99']:.1f} ms",
            flush=True,
        )
        print(
            "        whole-screen refresh (a filter keystroke), median of 5: "
            + ", ".join(f"{q or 'no filter'!r} {ms:.0f} ms" for q, ms in r["refresh"].items())
            + f"; rows shown while measuring: {r['shown']:,}",
            flush=True,
        )
        if a.type:
            print(
                f"        filter keystroke -> painted, {r['keys']} keys: p50 {r['k50']:.1f} ms, "
                f"p99 {r['k99']:.1f} ms, max {r['kmax']:.1f} ms (CPU of the loop thread: p50 "
                f"{r['kc50']:.1f} ms, p99 {r['kc99']:.1f} ms); peak RSS {r['maxrss']:.0f} MiB; "
                f"load average {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            print(
                "        slowest keys (wall / CPU, the query then): "
                + ", ".join(f"{w * 1000:.0f} / {c * 1000:.0f} ms {q!r}" for w, c, q in r["kslow"]),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
