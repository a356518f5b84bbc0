"""The agent's batches: every metric of a flush in one MetricBatch, every process's telemetry in one
TelemetryBatch, and a chunk of lines tested once before any line is parsed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from mscon.agent import protocol as P
from mscon.agent.main import Agent, Watched
from mscon.agent.metrics import LineParser
from test_agent import AgentUnderTest, _start


def test_metrics_and_telemetry_come_in_batches_in_order_and_complete(tmp_path: Path) -> None:
    a = AgentUnderTest()
    a.until(lambda m: isinstance(m, P.Hello))
    # 60 steps at 40 a second: about 1.5 s, so telemetry (once a second) is sampled at least once.
    a.send(_start(tmp_path, 2, ["--steps", "60", "--rate", "40", "--metrics"]))
    a.until(lambda m: isinstance(m, P.AllExited))
    a.send(P.Shutdown())
    assert a.proc.wait(timeout=10) == 0
    assert not [m for m in a.received if type(m) in (P.Metric, P.Telemetry)]  # only batches
    for rank in ("r0", "r1"):
        batches = [m for m in a.received if isinstance(m, P.MetricBatch) and m.name == rank]
        steps = [x.step for b in batches for x in b.metrics]
        assert steps == list(range(1, 61))  # none lost, none twice, in order
        assert len(batches) < 60  # several steps share a message
        assert all(
            x.source == "metrics" and x.name == rank and x.node == "n1" for b in batches for x in b.metrics
        )
        checksums = [x.checksum for b in batches for x in b.metrics if x.checksum]
        assert checksums == [f"sum-{s}" for s in range(5, 61, 5)]
    telemetry = [m for m in a.received if isinstance(m, P.TelemetryBatch)]
    assert telemetry and all(m.node == "n1" for m in telemetry)
    assert {t.name for m in telemetry for t in m.items} == {"r0", "r1"}


class _Spec:
    name, rank, local_rank = "r0", 0, 0


class _Proc:
    def __init__(self, tmp: Path) -> None:
        self.spec = _Spec()
        self.log_path = str(tmp / "r0.log")
        self.metrics_path = str(tmp / "r0.metrics.jsonl")


def test_a_chunk_without_loss_lines_is_not_parsed_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent("n1", out=io.StringIO())
    calls: list[str] = []
    real = LineParser.parse

    def counting(self: LineParser, line: str) -> P.Metric | None:
        calls.append(line)
        return real(self, line)

    monkeypatch.setattr(LineParser, "parse", counting)
    w = Watched(_Proc(tmp_path))  # type: ignore[arg-type]
    Path(w.proc.log_path).write_text(
        "".join(f"filler {i}\n" for i in range(100)) + "epoch: 1 step: 1, loss is 0.5\n"
    )
    agent._flush(w)
    assert calls == ["epoch: 1 step: 1, loss is 0.5"]  # the 100 fillers never reached the parser
    agent.outbox.close(5.0)  # written by the outbox's thread: let it finish
    sent = [json.loads(line) for line in agent.outbox.out.getvalue().splitlines()]  # type: ignore[attr-defined]
    assert [m["type"] for m in sent] == ["log", "rank_phase", "metrics"]  # its first step, then the metric
