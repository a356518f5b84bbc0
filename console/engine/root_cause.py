"""The root cause of a failed attempt: the one verdict, computed here only.

- A rank that MindSpore itself names (``worker N is the first one timed out``, HCCL's ``remote
  rank``) is the cause: the scheduler that reports a timeout is only the witness.
- Otherwise the first failure of a worker by the agents' clocks (a hung or stopped rank counts
  from its last progress), or a node lost while the attempt ran; silent ranks that wait on their
  peers (``waits_on_peers``) are passed over when another failure is not such a wait.
- The scheduler is the cause only when no worker failed and none was named.
Ranks stopped by mscon are victims, never causes.
"""

from __future__ import annotations

from dataclasses import replace

from mscon.agent.evidence import KIND_STRENGTH
from mscon.agent.protocol import is_scheduler, rank_name
from mscon.console.engine.events import HANG_EXIT_CODE, Failure, FailureKind
from mscon.console.engine.state_views import AttemptView, RankView

_STRONG = KIND_STRENGTH["node_timed_out"]  # the scheduler's own verdicts and up


def first_failure(att: AttemptView, ranks: dict[str, RankView]) -> Failure | None:
    """The one verdict: which rank (or node) made this attempt fail.

    - A rank that MindSpore itself names (``worker N is the first one timed out``, HCCL's
      ``remote rank``) is the cause: the scheduler that reports a timeout is only the witness.
    - Otherwise the first failure of a worker by the agents' clocks (a hung or stopped rank
      counts from its last progress), or a node lost while the attempt ran. When some silent ranks
      wait on their peers and another failure is not such a wait, that one is the cause: ranks that
      wait in a collective fall silent together with the one they wait for, so their clocks alone
      would pick any of them.
    - The scheduler is the cause only when no worker failed and none was named.
    Ranks stopped by mscon are victims, never causes.
    """
    if att.root is not None:
        return att.root
    failures = att.failures + att.lost_nodes
    workers = [f for f in failures if not is_scheduler(f.rank)]  # lost nodes (rank None) too
    named = _named(att, ranks, strong=True) or ([] if workers else _named(att, ranks, strong=False))
    if named:
        accused = [f for f in workers if f.rank in named]
        if accused:
            best = min(accused, key=lambda f: (named.index(f.rank), f.ts_ns))  # type: ignore[arg-type]
            return _with_evidence(best, named_line(att, best.rank))
        return _named_failure(att, ranks, named[0])
    if workers:
        return min(_suspects(workers), key=lambda f: f.ts_ns)
    return min(failures, key=lambda f: f.ts_ns) if failures else None


# Where a silent rank waits for the others: MindSpore running a compiled graph (its collectives hold
# every rank until the last one arrives) or a communication op, innermost in its main thread.
_PEER_WAIT_FRAMES = (
    "mindspore/graph/api.py",  # _CellGraphExecutor (MindSpore 2.6 on)
    "mindspore/common/api.py",  # the same before 2.6
    "mindspore/communication/",
    "mindspore/ops/operations/comm_ops.py",
)


def waits_on_peers(f: Failure) -> bool:
    """A hung rank whose main thread waits where a collective waits: innermost in its Python stack
    (py-spy) one of ``_PEER_WAIT_FRAMES``; without a Python stack, in a futex (a collective's
    condition variable; a rank stuck elsewhere sleeps, reads or spins)."""
    if f.kind is not FailureKind.HUNG:
        return False
    top = main_thread_top(f.stack or "")
    if top is not None:
        return any(frame in top for frame in _PEER_WAIT_FRAMES)
    return "futex" in (f.wchan or "")


def main_thread_top(dump: str) -> str | None:
    """The innermost frame of the main thread in a py-spy dump (``Thread N (idle): "MainThread"``,
    then its frames innermost first), or None."""
    lines = dump.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("Thread ") and '"MainThread"' in line:
            for frame in lines[i + 1 :]:
                text = frame.strip()
                if text:
                    return None if text.startswith("Thread ") else text
            return None
    return None


def _suspects(workers: list[Failure]) -> list[Failure]:
    waiting = [f for f in workers if waits_on_peers(f)]
    elsewhere = [f for f in workers if not waits_on_peers(f)]
    return elsewhere if waiting and elsewhere else workers


def _named(att: AttemptView, ranks: dict[str, RankView], strong: bool) -> list[int]:
    """Ranks MindSpore named, strongest evidence first.

    The scheduler's heartbeat verdicts are strong: they override the clocks. HCCL's
    ``remote rank`` lines are weak (in a ring every survivor names the neighbour it waited
    for, and sub-communicator ranks are not global ranks): used only when no worker failed.
    """
    found = [ev for ev in att.evidence if (KIND_STRENGTH.get(ev.kind, 0) >= _STRONG) == strong]
    found.sort(key=lambda ev: -KIND_STRENGTH.get(ev.kind, 0))
    out: list[int] = []
    for ev in found:
        out.extend(r for r in ev.ranks if r not in out and rank_name(r) in ranks)
    return out


def _named_failure(att: AttemptView, ranks: dict[str, RankView], rank: int) -> Failure:
    r = ranks[rank_name(rank)]
    line = named_line(att, rank)
    return Failure(
        kind=FailureKind.NAMED,
        node=r.node,
        name=r.name,
        rank=rank,
        ts_ns=r.last_progress_ns or 0,
        clock=f"agent on {r.node}",
        code=HANG_EXIT_CODE,
        detail="named by MindSpore as the rank that stopped responding",
        tail=tuple(r.tail)[-20:],
        evidence=line,
    )


def named_line(att: AttemptView, rank: int | None) -> str | None:
    for ev in att.evidence:
        if rank in ev.ranks:
            return f"{ev.name} on {ev.node}: {ev.text}"
    return None


def _with_evidence(f: Failure, line: str | None) -> Failure:
    if line is None or f.evidence:
        return f
    return replace(f, evidence=line)


def who_is(name: str, rank: int | None, node: str) -> str:
    """A process in words: "r3 on node2", "the scheduler on node1"."""
    return f"the scheduler on {node}" if is_scheduler(rank) else f"{name} on {node}"


def describe(f: Failure | None) -> str:
    """The verdict in one line: who failed first, and how."""
    if f is None:
        return "no failure was recorded"
    if f.kind is FailureKind.NODE_LOST:
        return f.detail
    if f.kind is FailureKind.AGENT:
        return f"{f.node} could not start its processes: {f.detail}"
    who = who_is(f.name, f.rank, f.node)
    if f.kind in (FailureKind.STOPPED, FailureKind.HUNG, FailureKind.NAMED):
        return f"{who} hung first ({f.detail})"
    return f"{who} failed first ({f.detail})"
