"""Facts about messages kept on the message classes: which are journaled, streamed or sampled, how
batch items are laid out, how an MSCON_METRICS record becomes a Metric, and who says the grace."""

from __future__ import annotations

import dataclasses
import json

import pytest
from mscon.agent import protocol as P
from mscon.agent.metrics import from_record, phase_from_line


def _tags(attr: str) -> set[str]:
    return {tag for tag, cls in P._REGISTRY.items() if getattr(cls, attr)}


def test_journaled_are_the_lifecycle_messages_and_streamed_the_bulk_ones() -> None:
    assert _tags("journaled") == {
        "proc_started",
        "proc_exited",
        "proc_hung",
        "all_exited",
        "agent_error",
        "evidence",
        "coord",
        "rank_phase",
        "rank_resumed",
        "standby_state",
    }
    assert _tags("streamed") == {"log", "metric", "metrics", "telemetry", "telemetry_batch", "summary"}
    assert _tags("sampled") == {"metric", "metrics", "telemetry", "telemetry_batch", "summary"}  # not logs
    # Written ahead of queued batches (issue 44): what the policy must hear at once.
    assert _tags("alarm") == {"proc_exited", "proc_hung", "evidence", "agent_error"}
    assert not (P.Message.journaled or P.Message.streamed or P.Message.sampled or P.Message.alarm)


def test_what_the_policy_hears_is_journaled_too() -> None:
    # A follower reports these to its coordinator; an attaching console rebuilds them from journals.
    assert _tags("reported") <= _tags("journaled")


def test_batch_items_follow_the_dataclasses() -> None:
    names = [f.name for f in dataclasses.fields(P.Metric)]
    assert ["node", "name", "rank", *P._METRIC_REQUIRED, *(k for k, _ in P._METRIC_DEFAULTS)] == names
    assert P._TELEMETRY_FIELDS == tuple(f.name for f in dataclasses.fields(P.Telemetry))[1:]


def test_a_field_differing_from_its_default_travels_in_a_batch_and_only_then() -> None:
    defaults = dict(P._METRIC_DEFAULTS)
    for key, default in P._METRIC_DEFAULTS:
        value = "x" if isinstance(default, str) else 1.5
        m = P.Metric(node="n", name="r0", rank=0, step=4, **{key: value})  # type: ignore[arg-type]
        line = P.encode(P.MetricBatch(node="n", name="r0", rank=0, metrics=(m,)))
        assert json.loads(line)["metrics"] == [{"step": 4, key: value}]
        got = P.decode(line)
        assert isinstance(got, P.MetricBatch) and got.metrics == (m,)
        assert all(getattr(got.metrics[0], k) == v for k, v in defaults.items() if k != key)


def test_a_record_fills_every_optional_metric_field() -> None:
    record = {
        "step": 9,
        "epoch": 2,
        "loss": 0.5,
        "step_time_s": 0.25,
        "samples_per_s": 64,
        "loss_scale": 1024.0,
        "overflow": True,
        "device_memory_bytes": 2**30,
        "param_checksum": "abc",
        "profile_dir": "/p",
        "arrive_ts": 12.2,
        "ts": 12.5,
    }
    m = from_record("n", "r1", 1, record)
    unset = [f.name for f in dataclasses.fields(P.Metric) if getattr(m, f.name) is None]
    assert unset == []  # a field added to Metric without a record key would show here
    assert (m.samples_per_s, m.checksum, m.overflow, m.ts, m.source) == (64.0, "abc", True, 12.5, "metrics")


@pytest.mark.parametrize(
    ("key", "value"), [("epoch", 1.5), ("epoch", True), ("loss", "0.5"), ("overflow", 1), ("profile_dir", 3)]
)
def test_a_record_value_of_the_wrong_type_reads_as_none(key: str, value: object) -> None:
    m = from_record("n", "r1", 1, {"step": 1, key: value})
    assert getattr(m, key) is None


def test_start_and_stop_always_carry_the_grace() -> None:
    # The sender (the inventory's stop.grace_s) is the one place; the wire keeps no default of its own.
    with pytest.raises(P.ProtocolError):
        P.decode('{"type": "stop", "reason": "r"}')
    spec = P.ProcSpec(name="r0", rank=0, local_rank=0, argv=("x",))
    start = P.Start(run_id="x", node="n", attempt=0, run_dir="/r", cwd="/w", procs=(spec,), grace_s=0.5)
    raw = json.loads(P.encode(start))
    del raw["grace_s"]
    with pytest.raises(P.ProtocolError):
        P.decode(json.dumps(raw))


def test_a_lagging_view_skips_samples_but_never_log_lines_or_exits() -> None:
    from mscon.console.engine.bus import Subscription
    from mscon.console.engine.events import AgentEvent

    sub = Subscription("view", lag_limit=1, hard_limit=100)
    log = P.LogBatch(node="n", name="r0", rank=0, seq=0, lines=("x",), ts_ns=1)
    metric = P.Metric(node="n", name="r0", rank=0, step=1)
    telemetry = P.TelemetryBatch(node="n", items=())
    exited = P.AllExited(node="n", ts_ns=2)
    for msg in (log, metric, telemetry, log, exited):
        assert sub.put(AgentEvent(attempt=0, msg=msg))
    assert sub.dropped == 2
    assert [e.msg for e in sub._items] == [log, log, exited]  # type: ignore[union-attr]


def test_a_rank_phase_is_a_small_journaled_lifecycle_message() -> None:
    msg = P.RankPhase(node="n", name="r1", rank=1, phase=P.Milestone.JOINED, ts_ns=5)
    line = P.encode(msg)
    assert (
        line
        == '{"type":"rank_phase","node":"n","name":"r1","rank":1,"phase":"joined","ts_ns":5,"graph":null}\n'
    )
    assert P.decode(line) == msg
    compiled = P.RankPhase(
        node="n", name="r1", rank=1, phase=P.Milestone.COMPILED, ts_ns=6, graph=P.GraphSource.LOADED
    )
    assert P.decode(P.encode(compiled)) == compiled  # the first step says how it got its graph
    assert msg.journaled and not (msg.streamed or msg.sampled)  # never skipped by a view
    assert msg.reported  # a detached coordinator's policy hears a first step (no backoff after it)
    assert P.Milestone.FIRST_STEP not in P.Milestone.RECORDED  # the agent's word, not the rank's


@pytest.mark.parametrize(
    ("line", "phase", "ts_ns"),
    [
        ('{"phase": "imported", "ts": 12.5}', "imported", 12_500_000_000),
        ('{"phase": "compiled", "ts": 3}', "compiled", 3_000_000_000),
        ('{"phase": "first_step", "ts": 1.0}', None, None),
        ('{"phase": "bogus", "ts": 1.0}', None, None),
        ('{"phase": ["joined"], "ts": 1.0}', None, None),
        ('{"step": 1, "loss": 0.5, "ts": 1.0}', None, None),
        ('{"phase": "joined", "ts', None, None),  # a line a killed rank cut short
    ],
)
def test_a_phase_record_becomes_a_rank_phase(line: str, phase: str | None, ts_ns: int | None) -> None:
    got = phase_from_line("n", "r2", 2, line)
    if phase is None:
        assert got is None
    else:
        assert got == P.RankPhase(node="n", name="r2", rank=2, phase=phase, ts_ns=ts_ns or 0)


def test_a_phase_record_without_a_time_is_stamped_when_read() -> None:
    got = phase_from_line("n", "r2", 2, '{"phase": "ready", "ts": "soon"}')
    assert got is not None and got.ts_ns > 1_600_000_000 * 10**9


def test_existing_messages_keep_their_wire() -> None:
    # Adding RankPhase changed no other message's bytes.
    started = P.ProcStarted(node="n", name="r0", rank=0, pid=7, ts_ns=9, log_path="/l")
    assert P.encode(started) == (
        '{"type":"proc_started","node":"n","name":"r0","rank":0,"pid":7,"ts_ns":9,"log_path":"/l"}\n'
    )
    m = P.Metric(node="n", name="r0", rank=0, step=3, loss=0.5, ts=1.5, source="metrics")
    batch = P.MetricBatch(node="n", name="r0", rank=0, metrics=(m,))
    assert P.encode(batch) == (
        '{"type":"metrics","node":"n","name":"r0","rank":0,'
        '"metrics":[{"step":3,"loss":0.5,"ts":1.5,"source":"metrics"}]}\n'
    )
