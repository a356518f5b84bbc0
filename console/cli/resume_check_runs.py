"""What the resume check on nodes reads back: each rank's fetched log and metrics file of one
attempt of a run (``<logs dir>/<run id>/<node>/attempt_<N>/r<rank>.log`` and
``r<rank>.metrics.jsonl``, agent/layout.py), as check_compare's values. Pure over files."""

from __future__ import annotations

import re
from pathlib import Path

from mscon.agent import layout
from mscon.console.engine.events import AttemptSummary

from mscon_resume.check_compare import RankRun, Run, read_lines, read_records

_RANK_LOG = re.compile(r"^r(\d+)" + re.escape(layout.LOG_SUFFIX) + "$")
RUN_PLACEHOLDER = "<run>"  # each run's id, in every line: a script printing its folders prints the same


def rank_folders(run_dir: Path, attempt: int) -> dict[int, Path]:
    """Rank -> the attempt folder (of its node) that holds its log, from the fetched run folder."""
    found: dict[int, Path] = {}
    if not run_dir.is_dir():
        return found
    for node in sorted(run_dir.iterdir()):
        folder = Path(layout.attempt_folder(node, attempt))
        if not folder.is_dir():
            continue
        for log in folder.iterdir():
            m = _RANK_LOG.match(log.name)
            if m:
                found.setdefault(int(m.group(1)), folder)
    return found


def read_attempt(run_dir: Path, run_id: str, attempt: int, code: int | None) -> Run:
    """The ranks of one attempt (every rank up to the highest found; one with no files reads as
    empty), with ``run_id`` printed as one placeholder."""
    folders = rank_folders(run_dir, attempt)
    same = {run_id: RUN_PLACEHOLDER}
    ranks = []
    for rank in range(max(folders, default=-1) + 1):
        folder = folders.get(rank)
        if folder is None:
            ranks.append(RankRun((), ()))
            continue
        name = f"r{rank}"
        records = read_records(Path(layout.metrics_file(folder, name)))
        ranks.append(RankRun(records, read_lines(Path(layout.log_file(folder, name)), same)))
    return Run(code, tuple(ranks))


def attempt_code(attempt: AttemptSummary | None) -> int | None:
    """An attempt's exit status as the local check sees a run's: 0 when every rank exited 0, else
    the first rank's non-zero exit code; None when none exited with a code (killed, never ran)."""
    if attempt is None or not attempt.ranks:
        return None
    codes = [r.exitcode for r in attempt.ranks]
    if all(c == 0 for c in codes):
        return 0
    return next((c for c in codes if c not in (0, None)), None)


def last_step(run: Run) -> int:
    return max(run.ranks[0].steps, default=0) if run.ranks else 0
