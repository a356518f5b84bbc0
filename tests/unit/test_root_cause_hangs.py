"""The root cause among silent ranks (console/engine/root_cause.py): ranks that wait in a collective
fall silent together with the one they wait for, within milliseconds, so their clocks alone pick
any of them; the one that is not waiting on its peers is the cause. Stacks as py-spy dumps them."""

from __future__ import annotations

from mscon.console.engine.events import Failure, FailureKind
from mscon.console.engine.root_cause import first_failure, main_thread_top, waits_on_peers
from mscon.console.engine.state_views import AttemptView

IN_COLLECTIVE = """Process 8287: python trainer/train.py --parallel-mode data_parallel
Python v3.11.7 (/usr/bin/python3.11)

Thread 8301 (idle): "Thread-1 (_loop)"
    wait (threading.py:327)
Thread 8287 (idle): "MainThread"
    _CellGraphExecutor._exec_pip (mindspore/graph/api.py:2432)
    _wrap_func.<locals>.wrapper (mindspore/graph/api.py:256)
    _CellGraphExecutor.run (mindspore/graph/api.py:2452)
    Cell.compile_and_run (mindspore/nn/cell.py:1807)
    train (trainer/train.py:275)
"""
ELSEWHERE = """Process 8290: python trainer/train.py --parallel-mode data_parallel
Python v3.11.7 (/usr/bin/python3.11)

Thread 8290 (idle): "MainThread"
    train (trainer/train.py:268)
    main (trainer/train.py:310)
"""


def _hung(name: str, rank: int, ts_ns: int, stack: str | None = None, wchan: str | None = None) -> Failure:
    return Failure(
        kind=FailureKind.HUNG,
        node="node1" if rank < 2 else "node2",
        name=name,
        rank=rank,
        ts_ns=ts_ns,
        clock="agent",
        code=124,
        detail="no progress",
        stack=stack,
        wchan=wchan,
    )


def _root(*failures: Failure) -> Failure | None:
    return first_failure(AttemptView(0, failures=list(failures)), {})


def test_the_silent_rank_that_is_not_in_the_collective_is_the_cause_not_the_first_by_the_clock() -> None:
    waiting = [_hung(f"r{r}", r, 1_000 + r, IN_COLLECTIVE) for r in range(3)]
    culprit = _hung("r3", 3, 1_005, ELSEWHERE)  # its last line came last: the clock would name r0
    root = _root(*waiting, culprit)
    assert root is not None and root.name == "r3"


def test_without_python_stacks_a_futex_wait_is_the_collective() -> None:
    waiting = [_hung(f"r{r}", r, 1_000 + r, wchan="futex_do_wait") for r in range(3)]
    root = _root(*waiting, _hung("r3", 3, 1_005, wchan="hrtimer_nanosleep"))
    assert root is not None and root.name == "r3"


def test_when_every_silent_rank_waits_the_clock_decides() -> None:
    root = _root(*(_hung(f"r{r}", r, 2_000 - r, IN_COLLECTIVE) for r in range(4)))
    assert root is not None and root.name == "r3"  # the earliest last progress
    root = _root(_hung("r0", 0, 1_000, ELSEWHERE), _hung("r1", 1, 900, ELSEWHERE))
    assert root is not None and root.name == "r1"


def test_a_lost_node_or_a_crash_outranks_ranks_waiting_for_it() -> None:
    lost = Failure(FailureKind.NODE_LOST, "node2", "node2", None, 5_000, "console", 4, "node2 lost")
    root = _root(_hung("r0", 0, 1_000, IN_COLLECTIVE), _hung("r1", 1, 1_001, IN_COLLECTIVE), lost)
    assert root is not None and root.kind is FailureKind.NODE_LOST
    crash = Failure(FailureKind.SIGNAL, "node2", "r3", 3, 3_000, "agent", 139, "killed by SIGSEGV")
    root = _root(_hung("r0", 0, 1_000, IN_COLLECTIVE), crash)
    assert root is not None and root.name == "r3"


def test_the_main_thread_is_read_from_the_dump() -> None:
    assert main_thread_top(IN_COLLECTIVE) == "_CellGraphExecutor._exec_pip (mindspore/graph/api.py:2432)"
    assert main_thread_top(ELSEWHERE) == "train (trainer/train.py:268)"
    assert main_thread_top('Thread 1 (idle): "MainThread"\nThread 2 (idle): "x"\n    f (a.py:1)\n') is None
    assert main_thread_top("py-spy dump failed: Permission denied") is None
    stopped = Failure(FailureKind.STOPPED, "n", "r0", 0, 1, "agent", 124, "stopped", wchan="futex_do_wait")
    assert not waits_on_peers(stopped)  # a stopped rank is stopped, whatever it waited on


def test_the_summary_calls_the_waiting_peers_victims() -> None:
    from mscon.agent.protocol import ProcHung, ProcStarted
    from mscon.console.engine.events import AgentEvent, AttemptStarted, RankRef, RunStarted
    from mscon.console.engine.state import ClusterState

    st = ClusterState()
    st.apply(RunStarted(0, "run", "inv.yaml", ("node1", "node2"), 2, "/logs"))
    st.apply(AttemptStarted(0, (RankRef("r0", "node1", 0), RankRef("r1", "node2", 1)), "node1", 8118))
    for name, node, rank in (("r0", "node1", 0), ("r1", "node2", 1)):
        st.apply(AgentEvent(0, ProcStarted(node, name, rank, 100 + rank, 1_000, "/l")))
    # r0 waits in the AllReduce for r1, which sleeps; r0's last line came first by the clock
    st.apply(
        AgentEvent(
            0, ProcHung("node1", "r0", 0, 100, "no progress", "S", 5_000, 9_000, "futex", IN_COLLECTIVE)
        )
    )
    st.apply(AgentEvent(0, ProcHung("node2", "r1", 1, 101, "no progress", "S", 5_001, 9_000, "", ELSEWHERE)))
    roles = {s.name: (s.role, s.status) for s in st.rank_summaries()}
    assert roles == {"r0": ("victim", "hung"), "r1": ("root cause", "hung")}
