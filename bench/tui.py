"""Console benchmark: the TUI under 64, 256 and 1,024 ranks, each sending 2 metric updates and 20 log
lines a second (the agent batches lines every 0.1 s, so 10 log batches per rank per second).

    PYTHONPATH=.dev .venv/bin/python bench/tui.py [--ranks 64 256 1024] [--seconds 15] [--burst]

1,024 real processes are too many for a 2-core machine, so the events come from a synthetic source
that does what the supervisor does with an agent's messages (ClusterState.apply, then the EventBus,
whose "tui" sink is the console's buffer) at the rates above, each node's agent (64 ranks) in turn
over the 0.1 s (``--burst``: all at once). The app runs headless (the compositor renders every
frame; only the terminal write is skipped) on the Devices screen (panes up to 16 ranks, the table
above). Reported: CPU of the whole process as a fraction of one core, and of the
view alone (minus the synthetic engine, measured on its own); event arrival (the engine's receipt,
so the bus queue and the wait for a flush count) -> paint, and flush start -> paint (p50/p99);
resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".dev"))

from mscon.agent.protocol import (  # noqa: E402
    LogBatch,
    Metric,
    MetricBatch,
    ProcStarted,
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
from mscon.console.views.tui.app import MsconApp  # noqa: E402
from mscon.console.views.tui.feed import Changes  # noqa: E402
from mscon.console.views.tui.source import TUI_HARD_LIMIT, TUI_LAG_LIMIT, Handler, Source  # noqa: E402
from mscon.console.views.tui.widgets.rank_table import RankTable  # noqa: E402

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
    ) -> None:
        super().__init__()
        self.ranks = ranks
        self.lines_per_s = lines_per_s
        self.metrics_per_s = metrics_per_s
        self.seconds = seconds
        self.burst = burst  # every rank's batch at the same instant (else each node's agent in turn)
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
                    slow = 2.0 if i == 1 else 1.0
                    metric = Metric(
                        node_of[i],
                        n,
                        i,
                        step,
                        2.0 * 0.99**step,
                        1,
                        0.5 * slow,
                        64 / slow,
                        ts / 1e9,
                        "metrics",
                    )
                    self.emit(AgentEvent(0, MetricBatch(node_of[i], n, i, (metric,))))
            tick += 1
            delay = start + tick * BATCH_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.behind += 1
                await asyncio.sleep(0)
        await self.bus.close()
        return 0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def engine_only(ranks: int, seconds: float, burst: bool) -> float:
    """CPU (fraction of a core) of the synthetic engine with a sink that drops everything."""
    src = SyntheticSource(ranks, seconds, burst, RATES["lines"], RATES["metrics"])
    c0, t0 = time.process_time(), time.monotonic()
    src.start(lambda ev: None)
    await src.done.wait()
    return (time.process_time() - c0) / (time.monotonic() - t0)


async def with_console(
    ranks: int, seconds: float, warmup: float, screen: str, burst: bool
) -> dict[str, float]:
    src = SyntheticSource(ranks, seconds + warmup, burst, RATES["lines"], RATES["metrics"])
    refresh: dict[str, list[float]] = {}
    arrival_paint: list[float] = []
    flush_paint: list[float] = []
    measuring = False

    def on_paint(ch: Changes, t_flush: float, t_paint: float) -> None:
        if measuring:
            flush_paint.append(t_paint - t_flush)
            arrival_paint.extend(t_paint - a for a in ch.arrivals)

    app = MsconApp(src, on_paint=on_paint, toasts=False)
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
        await src.done.wait()
        cpu = (time.process_time() - c0) / (time.monotonic() - t0)
        measuring = False
        shown = app.main_screen.query_one(RankTable).row_count
        rss = proc.memory_info().rss
        await pilot.pause(0.3)
        dropped = src.bus.dropped()
    return {
        "cpu": cpu,
        "a50": pct(arrival_paint, 0.5) * 1000,
        "a99": pct(arrival_paint, 0.99) * 1000,
        "f50": pct(flush_paint, 0.5) * 1000,
        "f99": pct(flush_paint, 0.99) * 1000,
        "rss": rss / 2**20,
        "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "events": app.feed.total_events,
        "flushes": app.flushes,
        "behind": src.behind,
        "dropped": sum(n for _, n in dropped),
        "lines": sum(app.store.count(f"r{i}") for i in range(ranks)),
        "refresh": {q: pct(v, 0.5) * 1000 for q, v in refresh.items()},
        "shown": shown,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--screen", choices=["devices", "overview"], default="devices")
    p.add_argument("--burst", action="store_true", help="every rank's batch at once (no node stagger)")
    p.add_argument(
        "--queries", nargs="*", default=[], help="filters to time a whole refresh with (the last stays on)"
    )
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
    os.environ.pop("NO_COLOR", None)
    print(
        f"{a.seconds:g} s per size after {a.warmup:g} s warm-up; screen: {a.screen}; machine: "
        f"{psutil.cpu_count()} cores"
    )
    head = (
        f"{'ranks':>6} {'events/s':>9} {'cpu (core)':>10} {'view cpu':>9} {'arrive->paint p50/p99 ms':>25} "
        f"{'flush->paint p50/p99 ms':>24} {'rss MiB':>8} {'late ticks':>10} {'dropped':>8}"
    )
    print(head)
    for n in a.ranks:
        engine = asyncio.run(engine_only(n, min(a.seconds, 8.0), a.burst))
        r = asyncio.run(with_console(n, a.seconds, a.warmup, a.screen, a.burst))
        rate = r["events"] / (a.seconds + a.warmup)
        print(
            f"{n:>6} {rate:>9,.0f} {r['cpu']:>10.2f} {max(0.0, r['cpu'] - engine):>9.2f} "
            f"{r['a50']:>12.0f} / {r['a99']:<10.0f} {r['f50']:>11.1f} / {r['f99']:<10.1f} {r['rss']:>8.0f} "
            f"{r['behind']:>10} {r['dropped']:>8}",
            flush=True,
        )
        print(
            "        whole-screen refresh (a filter keystroke), median of 5: "
            + ", ".join(f"{q or 'no filter'!r} {ms:.0f} ms" for q, ms in r["refresh"].items())
            + f"; rows shown while measuring: {r['shown']:,}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
