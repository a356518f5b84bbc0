"""Run ids: the generated one (``slurm-$SLURM_JOB_ID`` inside a Slurm job, else the time and a random
tag), and the first free one, ``ID``, ``ID.1``, ``ID.2``..., when an earlier run left a folder with
that id (a Slurm job id that came round again, two clusters sharing a home folder). An id the user
gave is never changed: reusing it is refused with how to reuse it. Every id is a label (see
:func:`label_problem`): it names a folder here and on every node, so it must stay one plain name."""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

MAX_SUFFIX = 999  # beyond this many earlier runs of one id, something else is wrong
MAX_LENGTH = 128  # a folder name on every node, with room for a suffix under NAME_MAX
# A leading letter or digit: never hidden (``.``, ``..``), never read as a flag (``-x``).
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
RULE = f"a run id is 1 to {MAX_LENGTH} letters, digits, '.', '_' and '-', starting with a letter or digit"


class RunIdTaken(Exception):
    """Every suffix of a generated id is taken, or an id the user gave is; one line."""


def label_problem(run_id: str) -> str | None:
    """Why ``run_id`` cannot be a run id (a path, ``..``, a space, a control character...), in
    words with :data:`RULE`; None when it can."""
    if _LABEL.fullmatch(run_id) and len(run_id) <= MAX_LENGTH:
        return None
    return f"{run_id!r} is not a run id: {RULE}"


def generated_run_id(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job and job.isdigit():
        return f"slurm-{job}"
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def candidates(base: str) -> list[str]:
    return [base] + [f"{base}.{n}" for n in range(1, MAX_SUFFIX + 1)]


async def first_free(base: str, taken: Callable[[str], Awaitable[bool]]) -> str:
    """``base``, or its first suffix for which ``taken`` says no."""
    for run_id in candidates(base):
        if not await taken(run_id):
            return run_id
    raise RunIdTaken(f"run id {base}: {MAX_SUFFIX} earlier runs hold it and each of its suffixes")


def first_free_here(base: str, logs_root: Path) -> str:
    """``base``, or its first suffix with no folder under ``logs_root`` yet: the run's local folder is
    its own from the start (the nodes are asked too, once reached: ``first_free``)."""
    for run_id in candidates(base):
        if not (logs_root / run_id).exists() and not (logs_root / run_id).is_symlink():
            return run_id
    raise RunIdTaken(f"run id {base}: {MAX_SUFFIX} earlier runs hold it and each of its suffixes")


def reuse_hint(run_id: str, folder: str) -> str:
    """How to reuse an id the user gave, which an earlier run's folder holds."""
    return (
        f"run id {run_id}: {folder} holds an earlier run with this id; give another --run-id, "
        f"or remove that folder (mscon prune, or rm -r) to reuse it"
    )
