"""The resume check on nodes, its pure parts: what it reads back from fetched run folders
(console/cli/resume_check_runs.py) and the job it changes for the killed run."""

from __future__ import annotations

import json
from pathlib import Path

from mscon.agent import layout
from mscon.console.cli.resume_check_nodes import with_kill_at
from mscon.console.cli.resume_check_runs import (
    RUN_PLACEHOLDER,
    attempt_code,
    last_step,
    rank_folders,
    read_attempt,
)
from mscon.console.config.inventory import load_inventory_or_default
from mscon.console.engine.events import AttemptOutcome, AttemptSummary, RankSummary

from mscon_resume import env as resume_env

RUN_ID = "check-kr-abc123"


def _rank(run_dir: Path, node: str, attempt: int, rank: int, steps: range, lines: list[str]) -> None:
    folder = Path(layout.attempt_folder(run_dir / node, attempt))
    folder.mkdir(parents=True, exist_ok=True)
    records = [json.dumps({"step": s, "loss": 1.0 / s, "ts": 0.0}) for s in steps]
    Path(layout.metrics_file(folder, f"r{rank}")).write_text("\n".join([*records, '{"step": 9']) + "\n")
    Path(layout.log_file(folder, f"r{rank}")).write_text("".join(f"{line}\n" for line in lines))


def test_each_rank_is_read_from_its_nodes_attempt_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / RUN_ID
    _rank(run_dir, "node1", 1, 0, range(4, 7), [f"state in /home/u/runs/{RUN_ID}/node1", "done"])
    _rank(run_dir, "node2", 1, 1, range(4, 6), ["done"])
    _rank(run_dir, "node2", 0, 1, range(1, 4), ["killed"])  # another attempt: not read
    Path(layout.log_file(layout.attempt_folder(run_dir / "node1", 1), "sched")).write_text("scheduler\n")
    assert rank_folders(run_dir, 1) == {
        0: Path(layout.attempt_folder(run_dir / "node1", 1)),
        1: Path(layout.attempt_folder(run_dir / "node2", 1)),
    }
    run = read_attempt(run_dir, RUN_ID, 1, 0)
    assert run.code == 0 and len(run.ranks) == 2
    assert sorted(run.ranks[0].steps) == [4, 5, 6]  # the line a kill cut is skipped
    assert run.ranks[0].lines == (f"state in /home/u/runs/{RUN_PLACEHOLDER}/node1", "done")
    assert run.ranks[1].lines == ("done",)
    assert last_step(run) == 6


def test_a_rank_with_no_files_reads_as_empty_and_no_folder_as_no_ranks(tmp_path: Path) -> None:
    run_dir = tmp_path / RUN_ID
    _rank(run_dir, "node2", 0, 1, range(1, 3), ["x"])
    run = read_attempt(run_dir, RUN_ID, 0, None)
    assert [len(r.records) for r in run.ranks] == [0, 2]
    assert read_attempt(tmp_path / "nothing", RUN_ID, 0, None).ranks == ()
    assert last_step(read_attempt(tmp_path / "nothing", RUN_ID, 0, None)) == 0


def _attempt(*codes: int | None) -> AttemptSummary:
    ranks = tuple(
        RankSummary("n", f"r{i}", i, "ok", code, None, None, None, None) for i, code in enumerate(codes)
    )
    return AttemptSummary(0, AttemptOutcome.FAILED, "", 1.0, None, ranks)


def test_an_attempts_code_is_the_first_ranks_failure() -> None:
    assert attempt_code(_attempt(0, 0)) == 0
    assert attempt_code(_attempt(0, 65, 1)) == 65
    assert attempt_code(_attempt(None, 0)) is None  # killed by a signal
    assert attempt_code(_attempt(None, 3)) == 3
    assert attempt_code(_attempt()) is None
    assert attempt_code(None) is None


def test_the_killed_run_has_the_step_in_its_jobs_environment() -> None:
    inv = load_inventory_or_default(None)
    killed = with_kill_at(inv, 7)
    assert killed.job.env == {**inv.job.env, resume_env.CHECK_KILL_AT: "7"}
    assert resume_env.CHECK_KILL_AT not in inv.job.env
