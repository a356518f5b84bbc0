"""Issue 44: alarms first (the outbox's lane), lines by subscription (Subscribe, NodeSummary)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from conftest import wait_for
from mscon.agent import layout
from mscon.agent import protocol as P
from mscon.agent.main import Agent, Watched
from mscon.agent.outbox import Outbox
from mscon.console.engine.lines_wanted import (
    LinesWanted,
    RanksSpecError,
    SummaryPace,
    parse_ranks,
    summary_tick_s,
)
from test_agent import AgentUnderTest, _start


class _HeldOut:
    """A console that reads nothing until ``release``: the first write blocks the writer."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.blocked = threading.Event()
        self.release = threading.Event()

    def write(self, data: str) -> None:
        if not self.writes:
            self.blocked.set()
            self.release.wait(30)
        self.writes.append(data)

    def flush(self) -> None:
        pass


def test_an_alarm_queued_behind_batches_is_written_before_them() -> None:
    out = _HeldOut()
    box = Outbox(out)  # type: ignore[arg-type]
    box.put("first\n", streamed=True)
    wait_for(out.blocked.is_set, 10, "the writer to block on its first write")
    for i in range(200):  # the backlog of log batches that piles up meanwhile
        box.put(f"batch {i}\n", streamed=True)
    box.put("exit\n", streamed=False, alarm=True)
    out.release.set()
    box.close(10)
    lines = "".join(out.writes).splitlines()
    assert lines[0] == "first"  # already being written when the alarm came
    assert lines[1] == "exit"  # ahead of all 200
    assert lines[2:] == [f"batch {i}" for i in range(200)]  # the others in their order


def test_exits_hangs_and_blame_are_alarms_batches_are_not() -> None:
    assert P.ProcExited.alarm and P.ProcHung.alarm and P.Evidence.alarm and P.AgentError.alarm
    assert not (P.LogBatch.alarm or P.MetricBatch.alarm or P.NodeSummary.alarm or P.AllExited.alarm)


def test_node_summary_round_trips_the_wire() -> None:
    m = P.Metric(node="n1", name="r3", rank=3, step=7, loss=0.5, epoch=1, ts=12.5, step_time_s=0.2)
    msg = P.NodeSummary(node="n1", ts=13.0, counts=(P.RankCount("r3", 3, 120, 7),), metrics=(m,))
    back = P.decode(P.encode(msg))
    assert back == msg
    assert P.decode(P.encode(P.Subscribe(ranks=(0, 3), tick_s=2.0))) == P.Subscribe(ranks=(0, 3), tick_s=2.0)


class _Spec:
    def __init__(self, name: str, rank: int) -> None:
        self.name, self.rank, self.local_rank = name, rank, rank


class _Proc:
    def __init__(self, tmp: Path, name: str, rank: int) -> None:
        self.spec = _Spec(name, rank)
        self.log_path = str(tmp / f"{name}.log")
        self.metrics_path = str(tmp / f"{name}.metrics.jsonl")
        self.reported = False


def test_lines_of_an_unsubscribed_rank_are_not_sent_but_counted_and_kept(tmp_path: Path) -> None:
    agent = Agent("n1", out=io.StringIO())
    agent.subscribe(P.Subscribe(ranks=(0,), tick_s=1.0))
    watched = [Watched(_Proc(tmp_path, f"r{r}", r)) for r in (0, 1)]  # type: ignore[arg-type]
    agent.watched = watched
    for w in watched:
        Path(w.proc.log_path).write_text(
            "".join(f"{w.proc.spec.name} line {i}\nepoch: 1 step: {i + 1}, loss is 0.5\n" for i in range(50))
        )
        agent._flush(w)
    agent._summary_tick()
    agent.outbox.close(5.0)
    sent = [json.loads(line) for line in agent.outbox.out.getvalue().splitlines()]  # type: ignore[attr-defined]
    logs = [m for m in sent if m["type"] == "log"]
    assert {m["name"] for m in logs} == {"r0"}  # r1's lines never went to the console
    assert sum(len(m["lines"]) for m in logs) == 100
    assert not [m for m in sent if m["type"] == "metrics"]  # metrics travel in the summary
    (summary,) = [P.decode(json.dumps(m)) for m in sent if m["type"] == "summary"]
    assert isinstance(summary, P.NodeSummary)
    assert summary.counts == (P.RankCount("r0", 0, 100, 50), P.RankCount("r1", 1, 100, 50))
    assert [(m.name, m.step) for m in summary.metrics] == [("r0", 50), ("r1", 50)]  # the latest only
    # Nothing lost: r1's lines are all in its log file on the node (what the end's fetch copies).
    assert Path(watched[1].proc.log_path).read_text().count("r1 line") == 50


def test_a_rank_newly_in_sight_gets_its_recent_lines(tmp_path: Path) -> None:
    agent = Agent("n1", out=io.StringIO())
    agent.subscribe(P.Subscribe(ranks=(), tick_s=1.0))
    w = Watched(_Proc(tmp_path, "r1", 1))  # type: ignore[arg-type]
    agent.watched = [w]
    Path(w.proc.log_path).write_text("".join(f"line {i}\n" for i in range(300)))
    agent._flush(w)
    agent.subscribe(P.Subscribe(ranks=(1,), tick_s=1.0))
    agent.outbox.close(5.0)
    sent = [json.loads(line) for line in agent.outbox.out.getvalue().splitlines()]  # type: ignore[attr-defined]
    (log,) = [m for m in sent if m["type"] == "log"]
    assert log["seq"] == 100 and log["lines"] == [f"line {i}" for i in range(100, 300)]


def test_a_real_agent_sends_only_subscribed_lines_and_summaries(tmp_path: Path) -> None:
    a = AgentUnderTest()
    a.until(lambda m: isinstance(m, P.Hello))
    a.send(P.Subscribe(ranks=(1,), tick_s=0.2))
    a.send(_start(tmp_path, 2, ["--steps", "20", "--rate", "40"]))
    a.until(lambda m: isinstance(m, P.AllExited))
    a.send(P.Shutdown())
    assert a.proc.wait(timeout=10) == 0
    logs = [m for m in a.received if isinstance(m, P.LogBatch)]
    assert logs and {m.name for m in logs} == {"r1"}
    assert not [m for m in a.received if isinstance(m, P.MetricBatch | P.Metric)]
    summaries = [m for m in a.received if isinstance(m, P.NodeSummary)]
    assert summaries
    last = {c.name: c for s in summaries for c in s.counts}
    # Every line each rank printed was counted on the node (r0's as well, though never sent).
    for name in ("r0", "r1"):
        log = Path(layout.log_path(tmp_path / "run", 0, name)).read_text().splitlines()
        assert last[name].lines == len(log)
    assert sum(len(m.lines) for m in logs) == last["r1"].lines
    assert max(m.step for s in summaries for m in s.metrics if m.name == "r0") == 20


def test_views_wishes_are_united_per_node() -> None:
    wanted = LinesWanted()
    assert not wanted.any
    assert wanted.want("headless", {0})
    assert not wanted.want("tui", {0})  # no change to the union
    assert wanted.subscription([0, 1, 2], 1.0) == P.Subscribe(ranks=(0,), tick_s=1.0)
    assert wanted.subscription([8, 9], 1.0) == P.Subscribe(ranks=(), tick_s=1.0)
    assert wanted.want("tui", None)
    assert wanted.subscription([8, 9], 1.0).all_ranks


def test_lines_flag_values() -> None:
    assert parse_ranks("all") is None
    assert parse_ranks("none") == frozenset()
    assert parse_ranks("0,3,8-10") == {0, 3, 8, 9, 10}
    for bad in ("x", "3-1", "1-", "-2", ""):
        try:
            parse_ranks(bad)
        except RanksSpecError:
            continue
        raise AssertionError(f"{bad!r} accepted")


def test_the_summary_tick_slows_while_the_console_is_behind_and_recovers() -> None:
    pace = SummaryPace(nodes=500, behind=1000, slowest=20.0)
    assert pace.tick_s == 1.0
    assert not pace.observe(10, now=0.0)
    assert pace.observe(1000, now=0.0) and pace.tick_s == 2.0
    assert not pace.observe(5000, now=1.0)  # at most once a tick
    assert pace.observe(5000, now=2.0) and pace.tick_s == 4.0
    for t in (6.0, 14.0, 30.0):
        pace.observe(5000, now=t)
    assert pace.tick_s == 20.0  # never past ``slowest`` (a third of the hang timeout)
    assert not pace.observe(0, now=31.0)  # caught up, but for three ticks first
    assert pace.observe(0, now=90.0) and pace.tick_s == 10.0
    assert summary_tick_s(10_000) == 10.0 and summary_tick_s(3_000) == 3.0 and summary_tick_s(10) == 1.0
