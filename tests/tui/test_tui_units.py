"""The console's pure parts: stragglers, the line store, the rank filter, the replay clock, the CLI."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from mscon.agent.protocol import Metric
from mscon.console.engine.state_views import RankView
from mscon.console.engine.stragglers import StepTimes, StragglerPolicy, find_stragglers
from mscon.console.views.tui.filtering import rank_filter
from mscon.console.views.tui.linestore import LineStore
from mscon.console.views.tui.series import ClusterSeries
from mscon.console.views.tui.widgets.log_view import line_style
from tui_helpers import DATA


def test_a_rank_well_above_the_others_median_is_a_straggler() -> None:
    base = {f"r{i}": [0.10] * 20 for i in range(7)}
    assert find_stragglers(base) == frozenset()
    assert find_stragglers({**base, "r7": [0.129] * 20}) == frozenset()  # under 1.3x
    assert find_stragglers({**base, "r7": [0.13] * 20}) == {"r7"}  # 1.3x: a straggler
    # only the last `window` steps count: an old slow patch is forgiven
    assert find_stragglers({**base, "r7": [0.5] * 10 + [0.1] * 20}) == frozenset()
    assert find_stragglers({**base, "r7": [0.2] * 20}, StragglerPolicy(factor=2.5)) == frozenset()
    assert find_stragglers({"r0": [0.1] * 20}) == frozenset()  # nobody to compare with
    assert find_stragglers({"r0": [0.1] * 2, "r1": [1.0] * 2}) == frozenset()  # too few samples
    assert find_stragglers({"r0": [0.1] * 8, "r1": [0.3] * 8}) == {"r1"}  # two ranks


def _metric(name: str, step: int, ts: float, step_time: float | None = None, epoch: int = 1) -> Metric:
    return Metric("n", name, int(name[1:]), step, 1.0, epoch, step_time, None, ts)


def test_step_times_are_reported_or_derived() -> None:
    st = StepTimes(window=3)
    for step in range(1, 6):
        st.observe(_metric("r0", step, 100.0 + step * 0.5))  # no step time: 0.5 s between steps
        st.observe(_metric("r1", step, 100.0 + step, step_time=0.2))
    assert st.recent("r0") == (0.5, 0.5, 0.5) and st.recent("r1") == (0.2, 0.2, 0.2)
    st.observe(_metric("r0", 5, 200.0))  # a repeat of step 5: ignored
    st.observe(_metric("r0", 1, 300.0, epoch=2))  # a new epoch: no derived time across it
    assert st.latest("r0") == 0.5 and len(st.history("r0")) == 4
    st.reset()
    assert st.recent("r0") == ()


def test_cluster_series_counts_each_step_once() -> None:
    s = ClusterSeries()
    for step in range(1, 5):
        for r in ("r0", "r1"):
            m = _metric(r, step, 10.0 + step * 0.001, step_time=0.25)  # 4 steps within one second
            s.observe(m, 0.25)
            s.observe(m, 0.25)  # the same step again (parsed line and metrics file)
    p = s.points()
    assert p.loss_steps == [1.0, 2.0, 3.0, 4.0] and p.loss == [1.0] * 4
    assert p.throughput_steps == p.loss_steps and p.throughput == [4.0] * 4 and p.unit == "steps/s"


def _sampled(name: str, step: int, loss: float, sps: float, epoch: int = 1) -> Metric:
    return Metric("n", name, int(name[1:]), step, loss, epoch, None, sps, 100.0 + step)


def test_cluster_series_means_loss_and_sums_samples_per_step() -> None:
    s = ClusterSeries()
    s.observe(_sampled("r0", 1, 2.0, 100.0))
    p = s.points()  # one rank in: its point is drawn at once, nothing waits for the step to complete
    assert (p.loss_steps, p.loss, p.throughput, p.unit) == ([1.0], [2.0], [100.0], "samples/s")
    s.observe(_sampled("r1", 1, 4.0, 300.0))
    s.observe(_sampled("r0", 2, 1.0, 100.0))
    p = s.points()
    assert p.loss_steps == [1.0, 2.0] and p.loss == [3.0, 1.0]
    assert p.throughput == [400.0, 200.0]  # the ranks' mean x the ranks reporting samples/s
    s.observe(_sampled("r1", 3, math.nan, 100.0))
    assert s.points().loss_steps == [1.0, 2.0]  # a NaN loss is not a point


def test_cluster_series_lays_epochs_end_to_end() -> None:
    within, through = ClusterSeries(), ClusterSeries()
    for epoch in (1, 2):
        for step in (1, 2, 3):
            within.observe(_sampled("r0", step, 1.0, 10.0, epoch))  # LossMonitor: steps within the epoch
            through.observe(_sampled("r0", (epoch - 1) * 3 + step, 1.0, 10.0, epoch))
    assert within.points().loss_steps == through.points().loss_steps == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_cluster_series_keeps_the_whole_run_in_bounded_memory() -> None:
    s = ClusterSeries(keep=64)
    for step in range(1, 1001):
        s.observe(_sampled("r0", step, 1000.0 / step, 10.0))
    p = s.points()
    assert len(p.loss_steps) <= 64 and s.stride == 16
    assert p.loss_steps[0] == 0.0 and p.loss_steps[-1] >= 976.0  # first and last steps still there
    assert p.loss == sorted(p.loss, reverse=True)


def test_a_restart_replaces_the_steps_it_runs_again() -> None:
    s = ClusterSeries()
    for step in (1, 2, 3):
        s.observe(_sampled("r0", step, 5.0, 10.0))
    s.new_attempt()
    s.observe(_sampled("r0", 2, 1.0, 10.0))  # resumed from the checkpoint of step 1
    assert s.points().loss == [5.0, 1.0, 5.0]


def test_line_store_keeps_every_line_on_disk(tmp_path: Path) -> None:
    store = LineStore(tmp_path)
    store.append("r0", ["a", "b"])
    store.append("r1", ["ünï", ""])
    store.append("r0", (f"line {i}" for i in range(100_000)))
    assert store.count("r0") == 100_002 and store.count("r1") == 2 and store.count("r9") == 0
    assert store.line("r0", 0) == "a" and store.line("r0", 100_001) == "line 99999"
    assert store.line("r1", 0) == "ünï" and store.line("r1", 1) == "" and store.line("r1", 5) == ""
    assert [t for _, t in store.lines("r0", 1, 4)] == ["b", "line 0", "line 1"]
    store.close()
    assert not any(tmp_path.iterdir())


def test_rank_filter_words() -> None:
    r = RankView("r3", "node-a", 3)
    r.tail.append("epoch: 1 step: 9, loss is 0.5")
    assert rank_filter("")(r, False)
    assert rank_filter("r3")(r, False) and not rank_filter("r4")(r, False)
    assert rank_filter("node:node-a state:pend")(r, False)
    assert not rank_filter("node:b")(r, False)
    assert rank_filter("straggler")(r, True) and not rank_filter("state:straggler")(r, False)
    assert rank_filter("LOSS")(r, False)


def test_tracebacks_and_errors_are_highlighted() -> None:
    assert line_style("Traceback (most recent call last):") == "red"
    assert line_style('  File "train.py", line 3, in <module>') == "red"
    assert line_style("RuntimeError: boom") == "red"
    assert line_style("[ERROR] ME(1):x") == "red"
    assert line_style("[WARNING] slow") == "yellow"
    assert line_style("epoch: 1 step: 2, loss is 0.5") is None


def test_cli_replay_and_up_need_a_terminal(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mscon.console.cli", *args], capture_output=True, text=True, timeout=60
        )

    done = cli("replay", str(DATA / "ok.jsonl"))
    assert done.returncode == 2 and "needs a terminal" in done.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "nope"}\n')
    done = cli("replay", str(bad))
    assert done.returncode == 2 and "not a recording" in done.stderr
    done = cli("up", str(tmp_path / "missing.yaml"))
    assert done.returncode == 2
    inv = Path(__file__).resolve().parents[2] / "inventory" / "local.yaml"
    done = cli("up", str(inv))
    assert done.returncode == 2 and "mscon up needs a terminal" in done.stderr


def test_rank_table_rows_render_as_their_text_would() -> None:
    """The table builds its rows as segments (no Text per cell): same cells, cuts and styles."""
    from mscon.console.engine.events import RankState
    from mscon.console.views.tui import fmt
    from mscon.console.views.tui.widgets.rank_table import _line, _segments, _sig
    from rich.console import Console
    from rich.segment import Segment
    from rich.text import Text

    console = Console(width=300)
    rows = [
        (Text("r1", style=fmt.ROOT_STYLE), "node-with-a-long-name", fmt.rank_state(RankState.RUNNING, True))
        + ("12", "0.1234", Text("1.2 s", style=fmt.STRAGGLER_STYLE), "64", "n/a", "3")
        + (Text("x" * 100, style="dim"),),
        (
            Text("r2"),
            "nöde-日本語-long",
            fmt.rank_state(RankState.HUNG),
            "-",
            "-",
            Text("-"),
            "-",
            "1 GiB",
            "-",
        )
        + (Text("日本語" * 40, style="dim"),),
        (Text("r3"), "a\tb", fmt.rank_state(RankState.FAILED), "-", "-", Text("-"), "-", "-", "-", Text("")),
    ]

    def cells(segments: list[Segment]) -> list[tuple[str, str]]:
        return [(s.text, str(s.style or "")) for s in Segment.simplify(segments)]

    for row in rows:
        assert cells(list(_line(row).render(console))) == cells(_segments(row, console))
    # a row whose only change is a style (a rank turning root cause) is a different row
    plain = (Text("r1"),) + rows[0][1:]
    assert plain == rows[0] and _sig(plain) != _sig(rows[0])


def test_start_up_phases_follow_the_recording() -> None:
    from mscon.console.engine.events import AttemptStarted, NodeState, NodeUpdate, RunStarted
    from mscon.console.engine.state import ClusterState
    from mscon.console.views.tui.startup import phases, starting
    from tui_helpers import recording

    state = ClusterState()
    seen: list[tuple[int, ...]] = []
    for ev in recording("checks"):
        state.apply(ev)
        if isinstance(ev, RunStarted | NodeUpdate | AttemptStarted):
            seen.append(tuple(p.done for p in phases(state)))
        if isinstance(ev, NodeUpdate) and ev.state is NodeState.CONNECTING:
            assert starting(state)
    names = [p.name for p in phases(state)]
    assert names == ["connect", "deploy", "checks", "ranks"]
    connect, deploy, checks, ranks = phases(state)
    assert (connect.done, deploy.done, ranks.done, ranks.total) == (1, 1, 4, 4)
    assert checks.failed == 1  # the recording's failed disk check
    assert seen[0] == (0, 0, 0, 0)  # nothing done at RunStarted
    assert not starting(state)  # the run is over: no start-up panel


def test_nodes_keep_the_host_they_were_given() -> None:
    from mscon.console.engine.events import RunStarted
    from mscon.console.engine.state import ClusterState

    state = ClusterState()
    state.apply(RunStarted(0, "r", "inv.yaml", ("a", "b"), 4, "/tmp/x", hosts=("node-a", "10.0.0.2")))
    assert [(n.name, n.host) for n in state.nodes.values()] == [("a", "node-a"), ("b", "10.0.0.2")]


def test_straggler_thresholds_are_checked_on_the_command_line(tmp_path: Path) -> None:
    from conftest import mscon

    done = mscon("run", "--no-tui", "--straggler-factor", "0.5", cwd=tmp_path)
    assert done.code == 2 and "--straggler-factor" in done.err and "Traceback" not in done.err


def test_the_failure_screen_and_restart_question_say_whether_r_would_start_warm() -> None:
    """What the operator reads before pressing r: the policy's word on the standby cluster (one
    StandbyUpdated per node; its ``warm`` is the whole cluster's), with the node and cause when cold."""
    from types import SimpleNamespace

    from mscon.console.engine.events import (
        AttemptStarted,
        AwaitingOperator,
        RankRef,
        RunStarted,
        StandbyUpdated,
        from_json,
        to_json,
    )
    from mscon.console.engine.state import ClusterState
    from mscon.console.views.tui.feed import _notice_text
    from mscon.console.views.tui.screens.failure import failure_text, restart_outlook_text

    st = ClusterState()
    refs = (RankRef("r0", "a", 0), RankRef("r1", "b", 1))
    st.apply(RunStarted(0, "run", "inv.yaml", ("a", "b"), 2, "/logs", 1))
    st.apply(AttemptStarted(0, refs, "a", 8118))
    model = SimpleNamespace(state=st)
    assert restart_outlook_text(st) == "cold: no standby cluster has joined; it is a full launch"
    a_ready = StandbyUpdated(1, "a", True, False)
    st.apply(a_ready)
    assert st.restart_outlook() == (False, "the standby cluster has joined on 1 of 2 nodes")
    assert _notice_text(a_ready) == ""  # one node's join is not news; the whole cluster's is
    b_ready = StandbyUpdated(1, "b", True, True)
    assert from_json(to_json(b_ready)) == b_ready  # recordings replay it
    st.apply(b_ready)
    assert st.restart_outlook() == (True, "")
    assert "ready on every node" in _notice_text(b_ready)
    assert "r restarts" not in failure_text(model).plain  # still running: not the question yet
    st.apply(AwaitingOperator(0, "r1 on b failed first"))
    warm = "r restarts the whole group warm: every node's standby cluster has joined"
    assert warm in failure_text(model).plain
    b_lost = StandbyUpdated(1, "b", False, False, "the spare for r1 exited (SIGKILL)")
    st.apply(b_lost)
    said = "cold: the standby on b is gone: the spare for r1 exited (SIGKILL); it is a full launch"
    assert restart_outlook_text(st) == said and said in failure_text(model).plain
    assert _notice_text(b_lost) == (
        "b: standby for attempt 1 lost (the spare for r1 exited (SIGKILL)): a restart would be cold"
    )
    # The attempt it stood by for starts: used up, whatever it was
    st.apply(AttemptStarted(1, refs, "a", 8119, warm=True))
    assert st.attempt is not None and st.attempt.warm
    assert st.restart_outlook() == (False, "no standby cluster has joined")
