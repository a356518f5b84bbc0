"""agent/tail.py: the rank-log reader keeps every line, however much is left when a rank exits; LineMetrics
parses the loss and step-time lines of unmodified scripts (recorded samples per format)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from mscon.agent.tail import NO_STEP, FileTail, LineMetrics, ParsedMetric


def test_final_read_returns_everything_left_beyond_the_running_bound(tmp_path: Path) -> None:
    # A rank that prints ~10 MiB and exits before the agent's next poll: the running reads are
    # bounded (4 MiB), the final one must take the rest (it once stopped at 4 MiB too).
    log = tmp_path / "r0.log"
    lines = [f"line {i:07d} " + "x" * 90 for i in range(100_000)]
    log.write_text("\n".join(lines) + "\n")
    tail = FileTail(str(log))
    first = tail.read_lines()
    assert 0 < len(first) < len(lines)  # bounded while running
    rest = tail.read_lines(final=True)
    assert first + rest == lines


def test_partial_lines_wait_for_their_newline_until_the_end(tmp_path: Path) -> None:
    log = tmp_path / "r0.log"
    log.write_bytes(b"epoch: 1 step: 1, loss is 2.5\nhalf a li")
    tail = FileTail(str(log))
    assert tail.read_lines() == ["epoch: 1 step: 1, loss is 2.5"]
    with log.open("ab") as f:
        f.write(b"ne\r\nno newline at exit")
    assert tail.read_lines() == ["half a line"]
    assert tail.read_lines(final=True) == ["no newline at exit"]
    assert LineMetrics().parse("epoch: 1 step: 1, loss is 2.5") == ParsedMetric(1, 2.5, 1, None)


def test_a_missing_file_is_no_lines_yet(tmp_path: Path) -> None:
    assert FileTail(str(tmp_path / "not-yet.log")).read_lines() == []


# --- LineMetrics: metrics from the log lines of unmodified scripts ---------------------------------

DATA = Path(__file__).parent / "data"
_MF = "2024-06-03 14:06:44,359 - mindformers[mindformers/core/callback/callback.py:346] - INFO - "


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # MindSpore LossMonitor (mindspore/train/callback/_loss_monitor.py), bare and with prefixes.
        ("epoch: 1 step: 1875, loss is 0.0212", ParsedMetric(1875, 0.0212, 1, None)),
        ("epoch: 1 step: 100, loss is 2.1937520503997803", ParsedMetric(100, 2.1937520503997803, 1, None)),
        ("epoch: 2, step: 10, loss is 0.61", ParsedMetric(10, 0.61, 2, None)),
        ("epoch: 0, step: 10, loss is 0.61", ParsedMetric(10, 0.61, 0, None)),
        ("[INFO] epoch: 3 step: 7, loss is 1.25", ParsedMetric(7, 1.25, 3, None)),
        (
            "2024-05-20 10:11:12,345 - INFO - epoch: 1 step: 20, loss is 0.6931",
            ParsedMetric(20, 0.6931, 1, None),
        ),
        ("epoch:1 step:20,loss is 0.6931", ParsedMetric(20, 0.6931, 1, None)),
        # The loss printed as a Tensor (tutorials print the network output as it is).
        ("epoch: 1 step: 2, loss is [0.61234]", ParsedMetric(2, 0.61234, 1, None)),
        (
            "epoch: 1 step: 2, loss is Tensor(shape=[], dtype=Float32, value= 0.61234)",
            ParsedMetric(2, 0.61234, 1, None),
        ),
        (
            "epoch: 1 step: 2, loss is Tensor(shape=[1], dtype=Float32, value= [ 6.12340021e-01])",
            ParsedMetric(2, 0.612340021, 1, None),
        ),
        ("epoch: 1 step: 3, loss is np.float32(0.5)", ParsedMetric(3, 0.5, 1, None)),
        ("epoch: 4 step: 1, loss is 1e-05", ParsedMetric(1, 1e-05, 4, None)),
        # MindFormers MFLossMonitor (mindformers/core/callback/callback.py), sink and non-sink mode.
        (
            "{ Epoch:[  1/  2], step:[    1/  125], loss: 10.553, per_step_time: 1234ms, lr: 1e-05, "
            "overflow cond: False, loss_scale: 1.0, global_norm: [1.23], train_throughput_per_npu: 12.3T}",
            ParsedMetric(1, 10.553, 1, 1.234),
        ),
        (
            _MF + "{ Epoch:[  1/  2], step:[    2/  125], loss: 10.498, per_step_time: 1231ms, lr: 2e-05, "
            "overflow cond: False, loss_scale: 1.0, global_norm: [4.7765193], "
            "train_throughput_per_npu: 24.761T",
            ParsedMetric(2, 10.498, 1, 1.231),
        ),
        (
            _MF + "{ Epoch:[  1/  2], step:[    5/  125], loss:10.301, per_step_time: 1231ms, lr: 5e-05}",
            ParsedMetric(5, 10.301, 1, 1.231),
        ),
        (
            _MF
            + "{ Epoch:[  2/  2], step:[  125/  125], loss:[10.412/10.488], per_step_time: 1230ms, lr: 3e-05",
            ParsedMetric(125, 10.412, 2, 1.23),
        ),
        # PyTorch-style tutorials ported to MindSpore.
        ("Epoch [1/10], Step [100/600], Loss: 0.1234", ParsedMetric(100, 0.1234, 1, None)),
        ("epoch [1/10], step [100/600], loss: 0.1234", ParsedMetric(100, 0.1234, 1, None)),
        ("[rank 0] Epoch [3/10], Step [600/600], Loss: 0.0101", ParsedMetric(600, 0.0101, 3, None)),
        # MindSpore's quick-start tutorial: batch index within the epoch, no epoch number.
        ("loss: 2.302585  [  0/938]", ParsedMetric(0, 2.302585, None, None)),
        ("loss: 0.331207  [900/938]", ParsedMetric(900, 0.331207, None, None)),
        # TimeMonitor: a step time without a step number.
        ("epoch time: 1234.5 ms, per step time: 12.345 ms", ParsedMetric(NO_STEP, None, None, 0.012345)),
        (
            "Train epoch time: 21873.456 ms, per step time: 54.684 ms",
            ParsedMetric(NO_STEP, None, None, 0.054684),
        ),
        (
            "Train epoch time: 4518.037 ms, per step time: 11.295 ms (data time: 0.512 ms)",
            ParsedMetric(NO_STEP, None, None, 0.011295),
        ),
    ],
)
def test_line_metrics_recognises_recorded_lines(line: str, expected: ParsedMetric) -> None:
    got = LineMetrics().parse(line)
    assert got is not None
    assert (got.step, got.epoch) == (expected.step, expected.epoch)
    assert got.loss == pytest.approx(expected.loss)
    assert got.step_time_s == pytest.approx(expected.step_time_s)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("epoch: 1 step: 20, loss is nan", math.nan),
        ("epoch: 1 step: 20, loss is NaN", math.nan),
        ("epoch: 1 step: 20, loss is inf", math.inf),
        ("epoch: 1 step: 20, loss is -inf", -math.inf),
        ("epoch: 1 step: 20, loss is [nan]", math.nan),
        ("epoch: 1 step: 20, loss is Tensor(shape=[], dtype=Float32, value= inf)", math.inf),
        (_MF + "{ Epoch:[  1/  2], step:[    4/  125], loss:   nan, per_step_time: 1229ms", math.nan),
        ("Epoch [1/10], Step [100/600], Loss: inf", math.inf),
    ],
)
def test_nan_and_inf_losses_parse_to_float_nan_and_inf(line: str, expected: float) -> None:
    got = LineMetrics().parse(line)
    assert got is not None and got.loss is not None
    if math.isnan(expected):
        assert math.isnan(got.loss)
    else:
        assert got.loss == expected


@pytest.mark.parametrize(
    "line",
    [
        "loss is decreasing",
        "[INFO] ME(3175:139878786377536,MainProcess):2024-05-20 [model.py:1432] The loss is decreasing",
        "2024-06-03 14:06:48,052 - mindformers[callback.py:487] - WARNING - loss_scale is decreasing",
        # MindSpore's own nan/inf abort names no value (nan *or* inf): not a metric.
        "In epoch: 1 step: 20, loss is NAN or INF, training process cannot continue, terminating training.",
        "ValueError: epoch: 3 step: 17. Invalid loss, terminating training.",
        "epoch: 1 step: 20, loss is ",
        "epoch: 1, loss is 0.5",  # no step
        "step: 20, loss is 0.5",  # no epoch
        "Eval result: epoch 2, metrics: {'accuracy': 0.9453125}",
        "Train epoch time: 21873.456 ms",
        "epoch: 1 step: 20",
        "",
        "x" * 16 * 1024,
    ],
)
def test_lines_that_merely_mention_loss_do_not_parse(line: str) -> None:
    assert LineMetrics().parse(line) is None


def test_the_user_pattern_is_tried_first() -> None:
    m = LineMetrics(r"iter (?P<step>\d+)/\d+ \| ep (?P<epoch>\d+) \| xent=(?P<loss>\S+)")
    assert m.parse("[12:00:01] iter 300/5000 | ep 2 | xent=0.4471") == ParsedMetric(300, 0.4471, 2, None)
    nan = m.parse("iter 301/5000 | ep 2 | xent=nan")
    assert nan is not None and nan.step == 301 and math.isnan(nan.loss or 0.0)
    # It wins over the built-in formats where both match ...
    both = LineMetrics(r"step: (?P<step>\d+), loss is (?P<loss>\S+)")
    assert both.parse("epoch: 7 step: 20, loss is 0.5") == ParsedMetric(20, 0.5, None, None)
    # ... and lines it does not match still go to the built-in ones.
    assert m.parse("epoch: 1 step: 20, loss is 0.6931") == ParsedMetric(20, 0.6931, 1, None)


def test_the_user_pattern_loss_may_be_a_tensor_and_epoch_is_optional() -> None:
    m = LineMetrics(r"it=(?P<step>\d+) loss=(?P<loss>.+)$")
    assert m.parse("it=5 loss=[0.25]") == ParsedMetric(5, 0.25, None, None)
    assert m.parse("it=6 loss=Tensor(shape=[], dtype=Float32, value= 0.125)") == ParsedMetric(
        6, 0.125, None, None
    )
    assert m.parse("it=7 loss=unknown") == ParsedMetric(7, None, None, None)


@pytest.mark.parametrize(
    "pattern",
    [
        r"step (?P<step>\d+",  # does not compile: ignored
        r"(?P<loss>\S+)",  # no step group: ignored
        r"(?P<step>[a-z]+): (?P<loss>\S+)",  # a step that is not an integer: the line falls through
        "",
        None,
    ],
)
def test_a_broken_user_pattern_is_ignored(pattern: str | None) -> None:
    m = LineMetrics(pattern)
    assert m.parse("epoch: 1 step: 20, loss is 0.6931") == ParsedMetric(20, 0.6931, 1, None)
    assert m.parse("nothing here at all") is None


def test_whole_recorded_logs() -> None:
    m = LineMetrics()
    ms = [p for p in map(m.parse, (DATA / "mindspore_rank0.log").read_text().splitlines()) if p]
    assert [(p.epoch, p.step) for p in ms if p.step != NO_STEP] == [
        (e, s) for e in (1, 2) for s in (100, 200, 300, 400)
    ]
    assert [p.step_time_s for p in ms if p.step == NO_STEP] == pytest.approx([0.054684, 0.011295])
    mf = [p for p in map(m.parse, (DATA / "mindformers_rank0.log").read_text().splitlines()) if p]
    assert [p.step for p in mf] == [1, 2, 3, 4, 5]
    assert mf[0].step_time_s == pytest.approx(271.69) and math.isnan(mf[3].loss or 0.0)


def test_parse_is_cheap_on_lines_that_are_not_metrics() -> None:
    # The agent parses every line of every rank: non-metric lines must cost next to nothing.
    text = "\n".join(
        (DATA / name).read_text()
        for name in ("mindspore_rank0.log", "mindformers_rank0.log", "scheduler.log")
    )
    m = LineMetrics()
    others = [line for line in text.splitlines() if m.parse(line) is None]
    assert len(others) > 20
    lines = others * (200_000 // len(others) + 1)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        for line in lines:
            m.parse(line)
        best = max(best, len(lines) / (time.perf_counter() - t0))
    print(f"LineMetrics.parse: {best:,.0f} non-metric lines/s")
    assert best >= 50_000  # measured ~2.5M/s on a 2-core VM; the bound only catches a missing pre-check
