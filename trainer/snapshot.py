"""In-memory snapshots of the training state, so a restart loses at most one step.

At a step boundary the training thread copies every parameter (weights and optimizer state) to
host numpy arrays (``take``: the only part a step pays); a background thread writes the copy as
one ``.npz`` to a temp name and renames it into place, then drops all but the newest ``KEEP``.
A file's name carries its step, so a rank killed mid-write leaves only a temp file, never a
snapshot; a truncated or corrupt one fails ``np.load``'s CRC check and is skipped on resume.

Where: ``/dev/shm`` (RAM) when it is writable and has room, else a folder beside the durable
checkpoints. The durable checkpoints (``trainer/checkpoint.py``) stay as they are; on resume the
ranks agree on the newest step they *all* have, snapshot or checkpoint (:func:`agree`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import threading
import time
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

KEEP = 2  # a rank killed mid-write still has the previous one, which every other rank also has
_NAME_RE = re.compile(r"^snap_(\d+)\.npz$")
_META = "__mscon_meta__"  # the npz member holding the step and what the trainer needs to go on
SHM = "/dev/shm"
_HALF = 4096  # a step is sent as divmod(step, _HALF): both halves exact in float32
_SHM_HEADROOM = 2  # /dev/shm must hold this many times the state (KEEP snapshots + a temp file)


@dataclass(frozen=True)
class Snapshot:
    """One snapshot read back: its step, metadata and named arrays."""

    step: int
    meta: dict
    arrays: dict[str, np.ndarray]


def candidate_dirs(snapshot_dir: str | None, checkpoint_dir: str | None, shm: str = SHM) -> list[str]:
    """Where this rank's snapshots may be: ``--snapshot-dir`` when given, else
    ``/dev/shm/mscon-<key>`` (key: a digest of the checkpoint folder, which names the run and the
    node) and ``<checkpoint dir>/snapshots``, the fall-back when /dev/shm is missing or full."""
    if snapshot_dir:
        return [snapshot_dir]
    if not checkpoint_dir:
        return []
    root = os.path.abspath(checkpoint_dir)
    key = hashlib.sha256(root.encode()).hexdigest()[:16]
    return [os.path.join(shm, f"mscon-{key}"), os.path.join(root, "snapshots")]


def choose_dir(candidates: list[str], state_bytes: int, shm: str = SHM) -> str:
    """The first candidate that can take the snapshots: one under /dev/shm needs it writable with
    room for ``_SHM_HEADROOM`` states (``KEEP`` snapshots and a temp file)."""
    for folder in candidates[:-1]:
        if not folder.startswith(shm + os.sep):
            return folder
        try:
            free = shutil.disk_usage(shm).free if os.access(shm, os.W_OK) else 0
        except OSError:
            free = 0
        if free > _SHM_HEADROOM * state_bytes:
            return folder
    return candidates[-1]


def rank_dir(root: str, rank: int) -> str:
    return os.path.join(root, f"rank_{rank}")


def named_params(payload: Any) -> list[tuple[str, Any]]:
    """(name, Parameter) of what a runner checkpoints: a Cell, or a list of {"name", "data"}."""
    if isinstance(payload, list):
        return [(d["name"], d["data"]) for d in payload]
    return [(p.name, p) for p in payload.get_parameters()]


def take(params: list[tuple[str, Any]]) -> dict[str, np.ndarray]:
    """A host copy of every parameter, taken between steps (``asnumpy`` shares the tensor's memory
    on CPU, and the next step updates it in place: hence the copy)."""
    return {name: np.array(p.asnumpy(), copy=True) for name, p in params}


def steps(root: str, rank: int) -> list[int]:
    """The steps this rank has a snapshot file of, oldest first (not yet checked for damage)."""
    folder = rank_dir(root, rank)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME_RE.match, names) if m)


def path(root: str, rank: int, step: int) -> str:
    return os.path.join(rank_dir(root, rank), f"snap_{step}.npz")


def write(
    root: str, rank: int, step: int, arrays: dict[str, np.ndarray], meta: dict, keep: int = KEEP
) -> str:
    """Write one snapshot atomically (temp file + rename), then prune to the newest ``keep``."""
    folder = rank_dir(root, rank)
    os.makedirs(folder, exist_ok=True)
    final = path(root, rank, step)
    tmp = os.path.join(folder, f".snap_{step}.{os.getpid()}.tmp")
    info = {**meta, "step": step, "saved_at": time.time()}
    with open(tmp, "wb") as f:
        np.savez(f, **arrays, **{_META: np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)})
    os.replace(tmp, final)
    for old in steps(root, rank)[:-keep]:
        try:
            os.remove(path(root, rank, old))
        except FileNotFoundError:
            pass
    return final


def read(root: str, rank: int, step: int) -> Snapshot | None:
    """The snapshot of ``step``, or None when it is missing, truncated or corrupt (zip CRC)."""
    try:
        with np.load(path(root, rank, step), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop(_META).tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        print(
            f"mscon-trainer: snapshot of step {step} (rank {rank}) unreadable ({type(exc).__name__}); skipped"
        )
        return None
    if meta.get("step") != step:
        return None
    return Snapshot(step, meta, arrays)


def newest_valid(roots: list[str], rank: int) -> list[Snapshot]:
    """This rank's readable snapshots in any of ``roots``, newest first, at most ``KEEP``: only
    those can be common to every rank (each keeps its newest ``KEEP``)."""
    found: dict[int, Snapshot] = {}
    for root in roots:
        for step in reversed(steps(root, rank)):
            if step not in found and len(found) < KEEP:
                snap = read(root, rank, step)
                if snap is not None:
                    found[step] = snap
    return [found[s] for s in sorted(found, reverse=True)]


def remove(roots: list[str], rank: int) -> None:
    """Drop this rank's snapshots (training finished: nothing left to resume), and each root once
    no rank uses it: /dev/shm is memory."""
    for root in roots:
        shutil.rmtree(rank_dir(root, rank), ignore_errors=True)
        try:
            os.rmdir(root)
        except OSError:
            pass  # another rank's folder is still there, or it never existed


class Writer:
    """Writes snapshots on one background thread. ``submit`` hands over a copy taken at a step
    boundary; if the previous write is still going it waits for it first, so every rank writes
    the same steps (a skipped step on one rank would leave the ranks without a common one)."""

    def __init__(self, root: str, rank: int, keep: int = KEEP) -> None:
        self.root, self.rank, self.keep = root, rank, keep
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.copy_s = 0.0  # time the training thread spent copying, all snapshots together
        self.wait_s = 0.0  # time it spent waiting for the previous write
        self.write_s = 0.0  # time the background thread spent writing
        self.count = 0

    def submit(self, step: int, params: list[tuple[str, Any]], meta: dict) -> None:
        t0 = time.perf_counter()
        arrays = take(params)
        t1 = time.perf_counter()
        self.wait()
        self.copy_s += t1 - t0
        self.wait_s += time.perf_counter() - t1
        self.count += 1
        self._thread = threading.Thread(
            target=self._write, args=(step, arrays, meta), name="mscon-snapshot", daemon=True
        )
        self._thread.start()

    def _write(self, step: int, arrays: dict[str, np.ndarray], meta: dict) -> None:
        t0 = time.perf_counter()
        try:
            write(self.root, self.rank, step, arrays, meta, self.keep)
        except OSError as exc:  # a full /dev/shm must not stop training: the checkpoints remain
            self.error = exc
        self.write_s += time.perf_counter() - t0

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def summary(self) -> str:
        n = max(self.count, 1)
        return (
            f"{self.count} snapshot(s) to {rank_dir(self.root, self.rank)}: "
            f"copy {1e3 * self.copy_s / n:.2f} ms, "
            f"wait {1e3 * self.wait_s / n:.2f} ms on the step, write {1e3 * self.write_s / n:.2f} ms in the "
            "background, each"
        )


def agree(
    checkpoint_dir: str | None,
    rank: int,
    size: int,
    every: int,
    max_step: int,
    mine: list[int],
) -> tuple[int, bool]:
    """(step, from a snapshot): the newest step every rank can resume from (0: none), the latest
    durable checkpoint all ranks have complete or a snapshot step (``mine``: this rank's readable
    ones) all ranks have, whichever is newer. A collective: every rank calls it. One
    AllReduce(SUM), the CPU backend's only reduction, of the checkpoint slot vector followed by,
    per rank, its snapshot steps in its own slots, so the sum also all-gathers them. A step goes
    as (high, low) halves: float32 is exact to 2**24 only."""
    from trainer import checkpoint

    slots = checkpoint.slot_vector(checkpoint_dir, rank, every, max_step)
    gathered = np.zeros(size * KEEP * 2, dtype=np.float32)
    for i, s in enumerate(sorted(mine, reverse=True)[:KEEP]):
        base = (rank * KEEP + i) * 2
        gathered[base], gathered[base + 1] = divmod(s, _HALF)
    vec = np.concatenate([slots, gathered])
    counts = checkpoint.all_reduce_sum(vec) if size > 1 else vec
    ckpt = checkpoint.agreed_step(counts[: len(slots)], size, every)
    pairs = counts[len(slots) :].reshape(size, KEEP, 2).round().astype(np.int64)
    per_rank = [{int(hi) * _HALF + int(lo) for hi, lo in row} - {0} for row in pairs]
    common = set.intersection(*per_rank)
    snap = max(common, default=0)
    return (snap, True) if snap > ckpt else (ckpt, False)


class Interval:
    """Every how many steps a snapshot is taken: fixed, or (``auto``) every step until
    ``PROBE_STEPS`` have been timed, then the fewest steps whose copies cost at most ``budget`` of
    the step time. Every rank must snapshot the same steps (the resume needs one all have), so
    the ranks agree on the largest of their figures: one AllReduce, at one step, on every rank."""

    PROBE_STEPS = 5

    def __init__(self, every: int | str, budget: float) -> None:
        self.auto = every == "auto"
        self.every = 1 if self.auto else int(every)
        self.budget = budget
        self._timed: list[float] = []

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def observe(self, step_s: float, copy_s: float, rank: int, size: int) -> int | None:
        """After each step (``copy_s``: the copy time per snapshot so far): the agreed interval
        once decided at this step, else None."""
        if not self.auto or len(self._timed) > self.PROBE_STEPS:
            return None
        self._timed.append(step_s)
        if len(self._timed) <= self.PROBE_STEPS:
            return None
        step_s = sorted(self._timed[1:])[len(self._timed[1:]) // 2]  # the first step compiles
        self.every = agree_max(budget_interval(copy_s, step_s, self.budget), rank, size)
        return self.every


def budget_interval(copy_s: float, step_s: float, budget: float) -> int:
    """The fewest steps between snapshots whose copy (``copy_s`` each) costs at most ``budget`` of
    the step time: a restart then loses at most that many steps."""
    if copy_s <= 0 or step_s <= 0:
        return 1
    return max(1, math.ceil(copy_s / (budget * step_s)))


def agree_max(mine: int, rank: int, size: int) -> int:
    """The largest of every rank's ``mine`` (AllReduce(SUM) of a one-hot vector: the CPU backend
    reduces by SUM only). A collective: every rank calls it."""
    from trainer import checkpoint

    vec = np.zeros(max(size, 1), dtype=np.float32)
    vec[rank if size > 1 else 0] = mine
    got = checkpoint.all_reduce_sum(vec) if size > 1 else vec
    return int(round(float(got.max())))


def as_params(snap: Snapshot) -> dict[str, Any]:
    """The snapshot's arrays as the {name: Parameter} dict ``load_param_into_net`` takes."""
    import mindspore as ms

    return {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in snap.arrays.items()}
