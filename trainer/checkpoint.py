"""Rank-aware checkpoints: DIR/rank_N/step_S.ckpt, each made complete by a marker written after it.

A rank killed while saving leaves a .ckpt without its marker, which is never loaded. On resume
the ranks agree on the latest step that *every* rank has complete: each contributes a 0/1
vector over the possible checkpoint steps and an AllReduce(SUM) counts them (the CPU backend's
AllReduce supports SUM only).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

_STEP_RE = re.compile(r"^step_(\d+)\.ckpt$")


def rank_dir(root: str, rank: int) -> str:
    return os.path.join(root, f"rank_{rank}")


def complete_steps(root: str, rank: int) -> list[int]:
    folder = rank_dir(root, rank)
    if not os.path.isdir(folder):
        return []
    steps = []
    for name in os.listdir(folder):
        m = _STEP_RE.match(name)
        if m and os.path.exists(os.path.join(folder, name + ".done")):
            steps.append(int(m.group(1)))
    return sorted(steps)


def save(root: str, rank: int, step: int, params: Any, meta: dict, keep: int) -> str:
    import mindspore as ms

    folder = rank_dir(root, rank)
    os.makedirs(folder, mode=0o700, exist_ok=True)  # in the run's checkpoints/ (0700) on a node
    path = os.path.join(folder, f"step_{step}.ckpt")
    ms.save_checkpoint(params, path)
    with open(path + ".done", "w", encoding="utf-8") as f:  # written last: marks the file complete
        json.dump({**meta, "step": step, "saved_at": time.time()}, f)
    for old in complete_steps(root, rank)[:-keep]:
        for suffix in (".ckpt.done", ".ckpt"):  # marker first: a half-deleted pair is never "complete"
            try:
                os.remove(os.path.join(folder, f"step_{old}{suffix}"))
            except FileNotFoundError:
                pass
    return path


def slot_vector(root: str | None, rank: int, every: int, max_step: int) -> Any:
    """A 0/1 per multiple of ``every`` up to ``max_step``: whether this rank has it complete."""
    import numpy as np

    slots = max_step // every + 1
    have = np.zeros(slots, dtype=np.float32)
    for step in complete_steps(root, rank) if root else []:
        if step % every == 0 and step // every < slots:
            have[step // every] = 1.0
    return have


def agreed_step(counts: Any, size: int, every: int) -> int:
    """The latest slot of summed slot vectors that all ``size`` ranks have (0: none)."""
    agreed = [i * every for i in range(1, len(counts)) if int(round(float(counts[i]))) == size]
    return max(agreed, default=0)


def load(root: str, rank: int, step: int) -> tuple[dict[str, Any], dict]:
    """(parameters, the marker's metadata) of one complete checkpoint."""
    import mindspore as ms

    path = os.path.join(rank_dir(root, rank), f"step_{step}.ckpt")
    params = ms.load_checkpoint(path)
    with open(path + ".done", encoding="utf-8") as f:
        return params, json.load(f)
