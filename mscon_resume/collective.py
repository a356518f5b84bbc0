"""What the ranks agree on: the newest step every rank can resume from, and the snapshot interval.

Each is one AllReduce(SUM) (the CPU backend's only reduction) that every rank calls at the same
point of its script. Without a cluster (plain ``python``) nothing is exchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_HALF = 4096  # a step is sent as divmod(step, _HALF): both halves exact in float32


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the group's size; (0, 1) when no cluster was joined."""
    try:
        from mindspore.communication import get_group_size, get_rank

        return int(get_rank()), int(get_group_size())
    except Exception:  # noqa: BLE001 - init() not called: a single process
        return 0, 1


_CELL: Any = None


def all_reduce_sum(vec: np.ndarray) -> np.ndarray:
    """AllReduce(SUM) of a float32 numpy vector over the cluster, as numpy."""
    global _CELL
    import mindspore as ms
    from mindspore import nn, ops

    if _CELL is None:

        class Count(nn.Cell):
            def __init__(self) -> None:
                super().__init__()
                self.sum = ops.AllReduce(ops.ReduceOp.SUM)

            def construct(self, x: Any) -> Any:
                return self.sum(x)

        _CELL = Count()
    return _CELL(ms.Tensor(vec.astype(np.float32))).asnumpy()


@dataclass(frozen=True)
class Agreed:
    """What the ranks agreed on: the step to resume after (0: none), whether it is a snapshot's,
    and the ranks that refuse to resume (each says why in its own log)."""

    step: int
    from_snapshot: bool
    refusing: tuple[int, ...] = ()


def agree(
    rank: int, size: int, mine: list[int], keep: int, slots: np.ndarray | None = None, slot_step: Any = None
) -> tuple[int, bool]:
    """(step, from a snapshot): :func:`agree_resume` without a refusal."""
    got = agree_resume(rank, size, mine, keep, slots, slot_step)
    return got.step, got.from_snapshot


def agree_resume(
    rank: int,
    size: int,
    mine: list[int],
    keep: int,
    slots: np.ndarray | None = None,
    slot_step: Any = None,
    refusing: bool = False,
) -> Agreed:
    """The newest snapshot step every rank has (``mine``: this rank's readable ones, at most
    ``keep``), or, when the caller also keeps durable checkpoints, the newest of those every rank
    has (``slots``: a 0/1 vector, ``slot_step(counts)`` the agreed step of the summed vector),
    whichever is newer; 0: none. ``refusing``: this rank cannot resume exactly; every rank learns
    who refuses, so all stop together rather than some waiting in a collective. The sum also
    all-gathers the snapshot steps: each rank writes its own in its own slots. A step goes as
    (high, low) halves: float32 is exact to 2**24 only."""
    head = slots if slots is not None else np.zeros(0, dtype=np.float32)
    votes = np.zeros(size, dtype=np.float32)
    votes[rank if size > 1 else 0] = 1.0 if refusing else 0.0
    gathered = np.zeros(size * keep * 2, dtype=np.float32)
    for i, s in enumerate(sorted(mine, reverse=True)[:keep]):
        base = (rank * keep + i) * 2
        gathered[base], gathered[base + 1] = divmod(s, _HALF)
    vec = np.concatenate([head, votes, gathered]).astype(np.float32)
    counts = all_reduce_sum(vec) if size > 1 else vec
    ckpt = slot_step(counts[: len(head)]) if slots is not None else 0
    refused = tuple(int(r) for r in np.flatnonzero(counts[len(head) : len(head) + size].round() > 0))
    pairs = counts[len(head) + size :].reshape(size, keep, 2).round().astype(np.int64)
    per_rank = [{int(hi) * _HALF + int(lo) for hi, lo in row} - {0} for row in pairs]
    common = set.intersection(*per_rank) if per_rank else set()
    snap = max(common, default=0)
    # A tie goes to the snapshot: node memory, no checkpoint file to read
    if snap and snap >= ckpt:
        return Agreed(snap, True, refused)
    return Agreed(ckpt, False, refused)


def agree_max(mine: int, rank: int, size: int) -> int:
    """The largest of every rank's ``mine`` (AllReduce(SUM) of a one-hot vector)."""
    vec = np.zeros(max(size, 1), dtype=np.float32)
    vec[rank if size > 1 else 0] = mine
    got = all_reduce_sum(vec) if size > 1 else vec
    return int(round(float(got.max())))
