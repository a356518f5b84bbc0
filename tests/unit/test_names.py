"""One place says what a process is called, whether it is the scheduler, and how it ended
(agent/protocol.py), and every view says it that way."""

from __future__ import annotations

import io
import os

import pytest
from mscon.agent import protocol as P
from mscon.console.config.inventory import load_inventory_or_default
from mscon.console.engine.events import AgentEvent, AttemptStarted, FailureKind, RankRef
from mscon.console.engine.plan import build_plan
from mscon.console.engine.root_cause import describe, who_is
from mscon.console.engine.state import ClusterState
from mscon.console.views.headless.reporter import HeadlessReporter


def test_rank_names_round_trip() -> None:
    assert P.rank_name(3) == "r3" and P.rank_name(P.SCHEDULER_RANK) == P.SCHEDULER_NAME == "sched"
    for rank in (P.SCHEDULER_RANK, 0, 7, 1023):
        assert P.rank_of(P.rank_name(rank)) == rank
    for odd in ("", "r", "r-1", "r03", "rx", "R3", "r３", "sched0", "../r3", "3"):
        assert P.rank_of(odd) is None, odd
    assert P.is_scheduler(P.SCHEDULER_RANK) and not P.is_scheduler(0) and not P.is_scheduler(None)
    assert sorted(["r10", "zz", "r2", "sched", "r0"], key=P.by_rank) == ["sched", "r0", "r2", "r10", "zz"]


def _exited(signal: str | None, exitcode: int | None, signum: int | None = None) -> P.ProcExited:
    return P.ProcExited("n1", "r2", 2, 10, exitcode, signal, signum, 5, False)


@pytest.mark.parametrize(
    ("msg", "long", "short"),
    [
        (_exited(None, 7), "exit code 7", "exit 7"),
        (_exited("SIGKILL", None, 9), "killed by SIGKILL", "SIGKILL"),
        (_exited(None, 0), "exit code 0", "exit 0"),
    ],
)
def test_an_exit_is_described_one_way(msg: P.ProcExited, long: str, short: str) -> None:
    assert msg.describe() == long and msg.describe(short=True) == short


def test_views_use_the_one_description() -> None:
    st = ClusterState()
    refs = (RankRef("sched", "n1", -1), RankRef("r2", "n1", 2))
    st.apply(AttemptStarted(0, refs, "10.0.0.1", 8118))
    msg = _exited("SIGKILL", None, 9)
    st.apply(AgentEvent(0, msg))
    root = st.root_cause()
    assert root is not None and root.kind is FailureKind.SIGNAL and root.detail == msg.describe()
    assert describe(root) == "r2 on n1 failed first (killed by SIGKILL)"
    (row,) = [s for s in st.rank_summaries() if s.name == "r2"]
    assert row.status == msg.describe(short=True)
    assert who_is("sched", P.SCHEDULER_RANK, "n1") == "the scheduler on n1"


def test_the_plan_names_processes_by_rank() -> None:
    inv = load_inventory_or_default(None)
    names = [(s.name, s.rank) for p in build_plan(inv, "train.py", ()) for s in p.procs]
    assert names and all(P.rank_of(name) == rank for name, rank in names)
    assert [n for n, r in names if P.is_scheduler(r)] == ["sched"]


def test_the_reporter_names_the_scheduler_by_its_rank() -> None:
    err = io.StringIO()
    with open(os.devnull, "w") as out:
        rep = HeadlessReporter(out=out, err=err)
        rep.handle(AgentEvent(0, P.ProcExited("n1", "sched", -1, 10, 3, None, None, 5, False)))
        rep.handle(AgentEvent(0, _exited(None, 7)))
    assert err.getvalue().splitlines() == [
        "mscon: the scheduler on n1 failed: exit code 3",
        "mscon: r2 on n1 failed: exit code 7",
    ]
