"""A detached run's hang rule is the policy's, as on a console (issue 34): the coordinator hears
every node's ranks' progress over the links (``LinkProgress``) and has the ranks it decides to
inspect inspected by their agents, those nearly as long silent with the first past its limit.

Two real agents (n0 the coordinator, n1 a follower) each run one rank: r0 on n0 falls silent
waiting in a "collective" (a frame of a ``mindspore/communication`` package, as py-spy shows a
rank in an AllReduce), r1 on n1 stalls a fraction of a second later. r0 passes its limit first,
on either clock; the stop it causes must not come before r1 is inspected, or r1 has no stack and
the root cause blames the rank that was only waiting for it."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

from detached_agents import DetachedAgent
from mscon.agent import protocol as P
from mscon.console.engine.events import AgentEvent, AttemptStarted, RankRef, RunStarted
from mscon.console.engine.state import ClusterState

HANG_S = 3.0
LATER_S = 0.6  # r1 stalls this long after r0 fell silent: within SILENT_TOGETHER_S (1 s)

_RANK = """
import os, pathlib, sys, time
rank = int(os.environ["RANK_ID"])
here = pathlib.Path(sys.argv[1])
marker = here / "r0-silent"
sys.path.insert(0, str(here))
step = 0
while True:
    step += 1
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.05)
    if rank == 0 and step == 20:
        tmp = here / "r0-silent.tmp"
        tmp.write_text(repr(time.time()))
        tmp.rename(marker)
        from mindspore.communication.wait import all_reduce
        all_reduce()  # waits for r1, forever
    if rank == 1 and marker.exists() and time.time() >= float(marker.read_text()) + float(sys.argv[2]):
        while True:  # stalled, not in a collective
            time.sleep(3600)
"""

_WAIT = """
import threading


def all_reduce():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
"""


def _start(agent: DetachedAgent, run_dir: Path, rank: int, here: Path) -> P.ProcStarted:
    spec = P.ProcSpec(
        name=f"r{rank}",
        rank=rank,
        local_rank=0,
        argv=(sys.executable, str(here / "rank.py"), str(here), str(LATER_S)),
        env={"RANK_ID": str(rank), "MS_ROLE": "MS_WORKER"},
    )
    agent.send(
        P.Start(
            run_id="detached-hang",
            node=agent.node,
            attempt=0,
            run_dir=str(run_dir),
            cwd=str(here),
            procs=(spec,),
            grace_s=1.0,
        )
    )
    started = agent.until(lambda m: isinstance(m, P.ProcStarted))
    assert isinstance(started, P.ProcStarted)
    return started


def _root_cause(seen: list[P.Message]) -> object:
    """The console's verdict on what the agents said (as an attach rebuilds it from their journals)."""
    state = ClusterState()
    state.apply(RunStarted(0, "detached-hang", "", ("n0", "n1"), 2, ""))
    state.apply(AttemptStarted(0, (RankRef("r0", "n0", 0), RankRef("r1", "n1", 1)), "127.0.0.1", 1))
    for msg in seen:
        if isinstance(msg, P.ProcStarted | P.ProcHung | P.ProcExited):
            state.apply(AgentEvent(0, msg))
    return state.root_cause()


def test_a_detached_run_names_the_stalled_rank_not_its_waiting_peer(tmp_path: Path) -> None:
    here = tmp_path / "job"
    (here / "mindspore" / "communication").mkdir(parents=True)
    (here / "rank.py").write_text(textwrap.dedent(_RANK))
    (here / "mindspore" / "__init__.py").write_text("")  # a package: py-spy shows the package path
    (here / "mindspore" / "communication" / "__init__.py").write_text("")
    (here / "mindspore" / "communication" / "wait.py").write_text(_WAIT)
    n0, n1 = DetachedAgent("n0"), DetachedAgent("n1")
    try:
        _start(n0, tmp_path / "n0", 0, here)
        _start(n1, tmp_path / "n1", 1, here)
        port = n0.detach(
            role=P.Role.COORDINATOR,
            nodes=("n0", "n1"),
            workers={"r0": "n0", "r1": "n1"},
            hang_timeout_s=HANG_S,
            coordinator_host="127.0.0.1",
        ).coordinator_port
        joined = n1.detach(role=P.Role.FOLLOWER, coordinator_host="127.0.0.1", coordinator_port=port)
        assert joined.error == ""
        t0 = time.monotonic()
        n0.until(lambda m: isinstance(m, P.Coord) and m.kind == P.CoordKind.RUN_ENDED, timeout=60)
        named = time.monotonic() - t0
        n1.until(lambda m: isinstance(m, P.ProcExited), timeout=30)
        n0.until(lambda m: isinstance(m, P.ProcExited), timeout=30)
    finally:
        n0.kill()
        n1.kill()
    hung = {m.name: m for m in n0.seen + n1.seen if isinstance(m, P.ProcHung)}
    assert set(hung) == {"r0", "r1"}, (hung, n0.stderr[-2000:], n1.stderr[-2000:])
    # r0 passed its limit first; r1, nearly as long silent, was inspected with it by the coordinator.
    assert hung["r0"].why == "no progress for 3 s (hang.timeout_s)"
    assert hung["r1"].why == "no progress for 3 s (hang.timeout_s); inspected up to 1 s early, with r0"
    root = _root_cause(n0.seen + n1.seen)
    assert root is not None and (root.name, root.node) == ("r1", "n1"), root  # type: ignore[attr-defined]
    stopping = [m for m in n0.seen if isinstance(m, P.Coord) and m.kind == P.CoordKind.STOPPING]
    assert len(stopping) == 1 and "is hung" in stopping[0].reason, stopping
    print(f"named and ended {named:.1f} s after the follower joined")
    assert b"Traceback" not in n0.stderr + n1.stderr
