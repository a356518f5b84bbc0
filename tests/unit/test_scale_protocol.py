"""The batch messages (MetricBatch, TelemetryBatch): exact round trips on the wire and as
console events, order kept, nothing lost, malformed input refused."""

from __future__ import annotations

import json
import math

import pytest
from mscon.agent import protocol as P
from mscon.agent.tail import LineMetrics
from mscon.console.engine.events import AgentEvent, from_json, to_json


def _metric(step: int, **kw: object) -> P.Metric:
    return P.Metric(node="n1", name="r3", rank=3, step=step, **kw)  # type: ignore[arg-type]


FULL = _metric(
    7,
    loss=0.25,
    epoch=2,
    step_time_s=0.5,
    samples_per_s=128.0,
    ts=1700000000.5,
    source="metrics",
    loss_scale=1024.0,
    overflow=False,
    device_memory_bytes=2**33,
    checksum="abc",
    profile_dir="/tmp/prof",
)


def test_metric_batch_round_trips_every_field_in_order() -> None:
    metrics = (_metric(1, loss=0.5, ts=1.0), FULL, _metric(8), _metric(9, overflow=True))
    batch = P.MetricBatch(node="n1", name="r3", rank=3, metrics=metrics)
    line = P.encode(batch)
    assert P.decode(line) == batch
    wire = json.loads(line)
    # node, name and rank once; defaults left out
    assert wire["metrics"][2] == {"step": 8} and "node" not in wire["metrics"][1]
    assert [m.step for m in P.decode(line).metrics] == [1, 7, 8, 9]  # type: ignore[attr-defined]


def test_metric_batch_keeps_nan_and_inf_losses() -> None:
    batch = P.MetricBatch("n1", "r3", 3, (_metric(1, loss=math.nan), _metric(2, loss=math.inf)))
    got = P.decode(P.encode(batch))
    assert isinstance(got, P.MetricBatch)
    assert math.isnan(got.metrics[0].loss) and got.metrics[1].loss == math.inf  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "item", [{"loss": 0.5}, {"step": 1, "bogus": 2}, {"step": 1, "node": "other"}, [1, 2]], ids=str
)
def test_metric_batch_refuses_malformed_items(item: object) -> None:
    line = json.dumps({"type": "metrics", "node": "n1", "name": "r3", "rank": 3, "metrics": [item]})
    with pytest.raises(P.ProtocolError):
        P.decode(line)


def test_metric_batch_refuses_another_ranks_metric() -> None:
    with pytest.raises(ValueError):
        P.MetricBatch(node="n1", name="r0", rank=0, metrics=(_metric(1),))


def test_telemetry_batch_round_trips_and_refuses_short_rows() -> None:
    items = tuple(
        P.Telemetry("n1", f"r{i}", i, 50.0 + i, 2**30 + i, 1.5, device_util=None if i else 99.0)
        for i in range(3)
    )
    batch = P.TelemetryBatch(node="n1", items=items)
    assert P.decode(P.encode(batch)) == batch
    with pytest.raises(P.ProtocolError):
        P.decode(json.dumps({"type": "telemetry_batch", "node": "n1", "items": [["r0", 0, 1.0]]}))


@pytest.mark.parametrize(
    "msg",
    [
        P.MetricBatch("n1", "r3", 3, (_metric(1), FULL)),
        P.TelemetryBatch("n1", (P.Telemetry("n1", "r0", 0, 1.0, 2, 3.0),)),
    ],
    ids=lambda m: m.type,
)
def test_batches_round_trip_as_console_events(msg: P.Message) -> None:
    ev = AgentEvent(4, msg)
    raw = json.loads(json.dumps(to_json(ev)))
    assert from_json(raw) == ev


def test_line_metrics_candidates_are_exactly_the_lines_that_parse() -> None:
    lines = [
        "plain",
        "epoch: 1 step: 2, loss is 0.5",
        "INFO per step time: 12.5 ms",
        "LOSS went up",
        "{ Epoch:[  1/  2], step:[    3/  125], loss: 10.553, per_step_time: 1234ms}",
    ]
    lm = LineMetrics()
    picked = lm.candidates(lines)
    assert [line for line in lines if lm.parse(line) is not None] == [x for x in picked if lm.parse(x)]
    assert "plain" not in picked
    assert lm.candidates(["a", "b"]) == []
    user = LineMetrics(r"it (?P<step>\d+)")
    assert user.candidates(["it 3", "x"]) == ["it 3", "x"]  # a user pattern may match any line
