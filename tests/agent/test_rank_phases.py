"""A rank's start-up milestones on the agent: phase records read from MSCON_METRICS become RankPhase
messages (the rank's own timestamps, in file order, before the metrics that follow them), and the
first metric of each process, parsed or recorded, is its FIRST_STEP, said once."""

from __future__ import annotations

import io
import json
from pathlib import Path

from mscon.agent import protocol as P
from mscon.agent.main import Agent, Watched


class _Spec:
    name, rank, local_rank = "r0", 0, 0


class _Proc:
    def __init__(self, tmp: Path) -> None:
        self.spec = _Spec()
        self.log_path = str(tmp / "r0.log")
        self.metrics_path = str(tmp / "r0.metrics.jsonl")


def _sent(agent: Agent) -> list[P.Message]:
    agent.outbox.close(5.0)  # written by the outbox's thread: let it finish
    return [P.decode(line) for line in agent.outbox.out.getvalue().splitlines()]  # type: ignore[attr-defined]


def test_phase_records_and_the_first_step_reach_the_console_in_order(tmp_path: Path) -> None:
    agent = Agent("n1", out=io.StringIO())
    w = Watched(_Proc(tmp_path))  # type: ignore[arg-type]
    Path(w.proc.log_path).write_text("starting\n")
    records = [
        {"phase": "imported", "ts": 100.25},
        {"phase": "joined", "ts": 101.5},
        {"phase": "warmed", "ts": 101.6},  # not a milestone: ignored
        {"phase": "first_step", "ts": 101.7},  # the agent's to say, never the rank's
        {"phase": "ready", "ts": 102.0},
        {"phase": "compiled", "ts": 103.0},
        {"step": 1, "loss": 0.5, "ts": 103.5},
        {"step": 2, "loss": 0.4, "ts": 104.0},
    ]
    Path(w.proc.metrics_path).write_text("".join(json.dumps(r) + "\n" for r in records) + "not json\n")
    agent._flush(w)
    with open(w.proc.metrics_path, "a") as f:
        f.write(json.dumps({"step": 3, "loss": 0.3, "ts": 105.0}) + "\n")
    agent._flush(w)
    sent = [m for m in _sent(agent) if not isinstance(m, P.LogBatch)]
    phases = [(m.phase, m.ts_ns) for m in sent if isinstance(m, P.RankPhase)]
    assert phases == [
        ("imported", 100_250_000_000),
        ("joined", 101_500_000_000),
        ("ready", 102_000_000_000),
        ("compiled", 103_000_000_000),
        ("first_step", 103_500_000_000),  # the first metric's own timestamp, once
    ]
    assert all((m.node, m.name, m.rank) == ("n1", "r0", 0) for m in sent)
    assert [type(m).__name__ for m in sent] == ["RankPhase"] * 5 + ["MetricBatch"] * 2


def test_an_unmodified_script_gets_its_first_step_from_its_printed_loss(tmp_path: Path) -> None:
    agent = Agent("n1", out=io.StringIO())
    w = Watched(_Proc(tmp_path))  # type: ignore[arg-type]
    Path(w.proc.log_path).write_text("epoch: 1 step: 1, loss is 0.5\nepoch: 1 step: 2, loss is 0.4\n")
    agent._flush(w)
    sent = _sent(agent)
    phases = [m for m in sent if isinstance(m, P.RankPhase)]
    assert [m.phase for m in phases] == [P.Milestone.FIRST_STEP]
    batch = next(m for m in sent if isinstance(m, P.MetricBatch))
    assert phases[0].ts_ns == int(batch.metrics[0].ts * 1e9)


def test_a_resume_record_reaches_the_console_before_the_first_step(tmp_path: Path) -> None:
    agent = Agent("n1", out=io.StringIO())
    w = Watched(_Proc(tmp_path))  # type: ignore[arg-type]
    Path(w.proc.log_path).write_text("starting\n")
    records = [
        {"phase": "ready", "ts": 102.0},
        {"resume": {"step": 150, "epoch": 3, "source": "snapshot"}, "ts": 102.5},
        {"step": 151, "loss": 0.5, "ts": 103.5},
    ]
    Path(w.proc.metrics_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    agent._flush(w)
    sent = [m for m in _sent(agent) if not isinstance(m, P.LogBatch)]
    assert [type(m).__name__ for m in sent] == ["RankPhase", "RankResumed", "RankPhase", "MetricBatch"]
    assert sent[1] == P.RankResumed("n1", "r0", 0, 150, "snapshot", 3, 102_500_000_000)


def test_a_refusal_record_reaches_the_console_with_its_reason(tmp_path: Path) -> None:
    # mscon_resume refuses before the first step: the record is the rank's last line, its reason
    # one line, cut to RESUME_REASON_MAX.
    agent = Agent("n1", out=io.StringIO())
    w = Watched(_Proc(tmp_path))  # type: ignore[arg-type]
    Path(w.proc.log_path).write_text("mscon_resume: rank 0 refuses to resume: ...\n")
    reason = "keep holds two objects\nwith the parameter beta1_power: " + "x" * 400
    records = [
        {"phase": "ready", "ts": 102.0},
        {"resume": {"step": 0, "source": "refused", "reason": reason}, "ts": 102.5},
    ]
    Path(w.proc.metrics_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    agent._flush(w)
    sent = [m for m in _sent(agent) if not isinstance(m, P.LogBatch)]
    assert [type(m).__name__ for m in sent] == ["RankPhase", "RankResumed"]  # no first step
    got = sent[1]
    assert isinstance(got, P.RankResumed) and (got.step, got.source, got.ts_ns) == (
        0,
        "refused",
        102_500_000_000,
    )
    assert got.reason is not None and len(got.reason) == P.RESUME_REASON_MAX
    assert got.reason.startswith("keep holds two objects with the parameter beta1_power: xxx")
