"""The resume check (``mscon_resume.check``, issue 42): its comparisons over hand-written metrics
and output, and whole checks of a stand-in script (``data/resume_fake.py``, no MindSpore)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for

from mscon_resume import check
from mscon_resume.check_compare import (
    Kind,
    RankRun,
    Run,
    compare_finals,
    compare_lines,
    compare_steps,
    judge,
    read_lines,
    read_records,
)
from mscon_resume.check_run import _alive, spawn

FAKE = Path(__file__).resolve().parent / "data" / "resume_fake.py"


def rank(records: list[dict] | None = None, lines: list[str] | None = None) -> RankRun:
    return RankRun(tuple(records or ()), tuple(lines or ()))


def steps(first: int, last: int, loss: float = 0.5, **extra: object) -> list[dict]:
    return [
        {"step": s, "loss": loss / s, "ts": 1000.0 + s, "step_time_s": 0.1 * s, **extra}
        for s in range(first, last + 1)
    ]


# ------------------------------------------------------------------ reading


def test_records_skip_a_line_cut_by_the_kill_and_anything_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "metrics_0.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n[1, 2]\nnot json\n{"step": 2, "lo')
    assert read_records(path) == ({"step": 1, "loss": 0.5},)
    assert read_records(tmp_path / "none.jsonl") == ()


def test_a_runs_own_folder_reads_as_one_name(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    path.write_text(f"saving to {tmp_path}/k/state/ckpt\nstep 1\n")
    lines = read_lines(path, {f"{tmp_path}/k/state": "<state>", str(tmp_path): "<run>"})
    assert lines == ("saving to <state>/ckpt", "step 1")


def test_printed_leaves_out_the_librarys_and_mindspores_log_lines() -> None:
    got = rank(
        lines=[
            "[WARNING] ME(1234:140,MainProcess):2025-01-01-00:00:00.000.000 [x.py:1] something",
            "[ERROR] MD(99,7f,python):2025 [y.cc:2] other",
            "mscon_resume: rank 0 resumes after step 4 (snapshot saved 10:00:00)",
            "epoch 1 step 5 loss 0.25",
            "",
        ]
    )
    assert got.printed == ("epoch 1 step 5 loss 0.25",)
    assert got.resumed_after == 4


def test_the_resume_record_says_where_a_run_resumed_without_a_line() -> None:
    assert rank([{"resume": {"step": 7, "source": "snapshot"}}]).resumed_after == 7
    assert rank([{"resume": {"step": 0, "source": "none"}}]).resumed_after == 0


# ------------------------------------------------------------------ the metrics


def test_equal_steps_compare_and_timing_fields_are_ignored() -> None:
    u = rank(steps(1, 10, lr=0.1, samples_per_s=100.0, arrive_ts=5.0))
    r = rank([{**rec, "ts": 0.0, "step_time_s": 9.0, "samples_per_s": 1.0} for rec in steps(5, 10, lr=0.1)])
    assert compare_steps(u, r) == (None, 6)


def test_a_loss_one_bit_off_differs() -> None:
    u = rank(steps(1, 4))
    r_records = steps(3, 4)
    r_records[1]["loss"] = math.nextafter(r_records[1]["loss"], 1.0)  # its last bit
    assert r_records[1]["loss"] != u.steps[4]["loss"]
    found, compared = compare_steps(u, rank(r_records))
    assert found is not None and found[0] == "step 4 loss" and compared == 1


def test_a_field_only_one_run_has_differs() -> None:
    found, _ = compare_steps(rank(steps(1, 3, lr=0.1)), rank(steps(2, 3)))
    assert found == ("step 2 lr", "0.1", "(missing)")
    found, _ = compare_steps(rank(steps(1, 3)), rank(steps(2, 3, lr=0.1)))
    assert found == ("step 2 lr", "(missing)", "0.1")


def test_a_relaunch_that_stops_short_or_runs_on_differs() -> None:
    found, _ = compare_steps(rank(steps(1, 10)), rank(steps(5, 8)))
    assert found == ("last step", "10", "8")
    found, _ = compare_steps(rank(steps(1, 10)), rank(steps(5, 11)))
    assert found == ("step 11", "(no such step)", "a record")


def final(stage: str, **parts: str) -> dict:
    return {"final": {"stage": stage, "step": 10, "digest": "".join(parts.values()), "parts": parts}}


def test_a_relaunch_may_lack_a_stage_the_killed_run_finished() -> None:
    u = rank([final("pretrain", w="aa"), final("finetune", w="bb", b="cc")])
    k = rank([final("pretrain", w="aa")])
    assert compare_finals(u, k, rank([final("finetune", w="bb", b="cc")])) is None
    assert compare_finals(u, rank(), rank([final("finetune", w="bb", b="cc")])) == (
        "final of stage pretrain",
        "digest aa",
        "(never finished)",
    )


def test_a_final_with_another_digest_names_its_first_differing_part() -> None:
    u = rank([final("train", w="aa", b="bb", m="cc")])
    r = rank([final("train", w="aa", b="b0", m="c0")])
    assert compare_finals(u, rank(), r) == ("final of stage train part b", "bb", "b0")


# ------------------------------------------------------------------ the printed lines


def test_lines_align_from_the_end_and_a_reprinted_header_is_accepted() -> None:
    u = ("start", "epoch 0", "step 1", "step 2", "epoch 1", "step 3", "step 4", "done")
    assert compare_lines(u, ("start", "epoch 1", "step 4", "done")) is None
    assert compare_lines(u, u) is None


def test_the_first_line_that_is_no_reprint_is_shown_with_the_uninterrupted_line_there() -> None:
    u = ("start", "step 1 loss 0.5", "step 2 loss 0.25", "step 3 loss 0.125", "done")
    got = compare_lines(u, ("start", "step 2 loss 0.25", "step 3 loss 0.126", "done"))
    assert got == ("printed line 3", "'step 3 loss 0.125'", "'step 3 loss 0.126'")
    got = compare_lines(u, ("resuming from my own checkpoint", "done"))
    assert got == ("printed line 1", "'step 3 loss 0.125'", "'resuming from my own checkpoint'")


def test_a_relaunch_prints_only_what_comes_after_its_step() -> None:
    assert compare_lines(("a", "b", "c"), ("c",)) is None
    assert compare_lines(("a", "b"), ()) is None


# ------------------------------------------------------------------ the verdict


def run(code: int | None, *ranks: RankRun, timed_out: bool = False) -> Run:
    return Run(code, tuple(ranks), timed_out)


U = rank(steps(1, 10) + [final("train", w="aa")], ["start", "step 5", "step 10", "done"])
R = rank(
    [{"resume": {"step": 4, "source": "snapshot"}}, *steps(5, 10), final("train", w="aa")],
    [
        "mscon_resume: rank 0 resumes after step 4 (snapshot saved 10:00:00)",
        "start",
        "step 5",
        "step 10",
        "done",
    ],
)


def test_exact() -> None:
    v = judge(run(0, U), run(None, rank(steps(1, 4))), run(0, R))
    assert (v.kind, v.code) == (Kind.EXACT, 0)
    assert v.line == "resumes exactly (rank 0 resumed after step 4; 6 steps compared)"


def test_every_rank_is_compared() -> None:
    r1 = rank(R.records, ["start", "step 5", "step 10", "done", "extra"])
    v = judge(run(0, U, U), run(None), run(0, R, r1))
    assert v.kind is Kind.DIFFERS and v.line.startswith("differs: rank 1 printed"), v.line


def test_another_exit_code_differs() -> None:
    v = judge(run(0, U), run(None), run(1, R))
    assert v.line == "differs: rank 0 exit code: uninterrupted 0 / relaunched 1"
    v = judge(run(0, U), run(None), run(None, R, timed_out=True))
    assert v.line == "differs: rank 0 exit code: uninterrupted 0 / relaunched (still running)"


def test_refused() -> None:
    said = "mscon_resume: rank 0 refuses to resume: the optimizer is not kept; pass keep=(net, optimizer)"
    v = judge(run(0, U), run(None), run(65, rank([], ["start", said])))
    assert (v.kind, v.code, v.line) == (Kind.REFUSED, 3, f"refused: {said}")


def test_the_uninterrupted_run_fails() -> None:
    v = judge(
        run(2, rank([], ["start", "Traceback (most recent call last):", "ValueError: bad"])),
        run(None),
        run(None),
    )
    assert (v.kind, v.code) == (Kind.FAILS, 4)
    assert v.line == "the script fails uninterrupted (exit 2): ValueError: bad"


def test_a_relaunch_that_starts_over_exactly_is_said_so_with_its_reason() -> None:
    said = "mscon_resume: rank 0: no state every rank has; starting from the beginning"
    r = rank(U.records, [said, *U.lines])
    v = judge(run(0, U), run(None), run(0, r))
    assert (v.kind, v.code) == (Kind.STARTS_OVER, 5)
    assert v.line == f"starts over (exact, but no resume): {said}"
    plain = rank((), ("start", "done"))  # a script without the library
    v = judge(run(0, plain), run(0, plain), run(0, plain))
    assert v.line.startswith("starts over (exact, but no resume): no mscon_resume line or metrics record")


def test_the_kinds_exit_codes_are_the_clis() -> None:
    from mscon.console.cli.exit_table import RESUME_CHECK_CODES

    assert [(k.value, k.name) for k in Kind] == [(code, name) for code, name, _ in RESUME_CHECK_CODES]


# ------------------------------------------------------------------ whole checks of a stand-in script


def whole(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = check.main(list(argv))
    return code, capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("mode", "code", "first"),
    [
        ("exact", 0, "resumes exactly (rank 0 resumed after step "),
        ("differs", 1, "differs: rank 0 step "),
        ("refuses", 3, "refused: mscon_resume: rank 0 refuses to resume: the optimizer is not kept"),
        ("fails", 4, "the script fails uninterrupted (exit 1): done"),
        ("over", 5, "starts over (exact, but no resume): its resume record says step 0 (none)"),
    ],
)
def test_a_stand_in_script(capsys: pytest.CaptureFixture[str], mode: str, code: int, first: str) -> None:
    got, out = whole(capsys, "--at", "3", "--", str(FAKE), "--mode", mode)
    assert (got, out[0][: len(first)]) == (code, first), out


def test_the_kill_step_defaults_to_40_percent_of_the_run_and_a_kept_folder_stays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    keep = tmp_path / "kept"
    got, out = whole(capsys, "--keep-dir", str(keep), "--", str(FAKE), "--steps", "10")
    assert got == 0, out
    assert re.fullmatch(r"  killed: SIGKILL once a rank wrote step \d+ \(asked: 4\)", out[2]), out
    assert sorted(p.name for p in keep.iterdir()) == ["k", "r", "u"]
    assert (keep / "r" / "output.log").read_text().startswith("training starts\n")
    records = read_records(keep / "k" / "metrics_0.jsonl")
    assert max(r["step"] for r in records if "step" in r) in range(4, 10)


def test_the_fork_mode_kills_and_reaps_its_child(tmp_path: Path) -> None:
    # No MindSpore to import first here (check.main would): the forks run the stand-in as is.
    opts = check.Options(str(FAKE), ("--steps", "12"), at=3, fork=True, keep_dir=str(tmp_path / "k"))
    verdict = check.check(opts)
    assert verdict.kind is Kind.EXACT, verdict
    assert verdict.details[1].startswith("killed: SIGKILL once a rank wrote step "), verdict


def test_the_check_ends_a_run_past_its_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    got, out = whole(capsys, "--timeout", "0.3", "--", str(FAKE), "--step-s", "1")
    assert got == 4 and out[0].startswith("the script fails uninterrupted (still running at the timeout)"), (
        out
    )


def test_the_env_flag_reaches_every_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text("import os\nprint(os.environ['WANTED'])\nraise SystemExit(3)\n")
    got, out = whole(capsys, "--env", "WANTED=here it is", "--", str(script))
    assert (got, out[0]) == (4, "the script fails uninterrupted (exit 3): here it is")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["x.py"], "give the script after --"),
        (["--", "no-such-script.py"], "script no-such-script.py: no such file"),
        (["--"], "nothing after --"),
        (["--fork", "--nproc", "2", "--", str(FAKE)], "--fork: only with --nproc 1"),
        (["--env", "MSCON_RESUME=1", "--", str(FAKE)], "--env MSCON_RESUME: the check sets it"),
        (["--env", "NOEQUALS", "--", str(FAKE)], "--env NOEQUALS: expected KEY=VALUE"),
        (["--at", "0", "--", str(FAKE)], "--at: a step, 1 or more"),
        (["--at", "x", "--", str(FAKE)], "argument --at: invalid int value"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert check.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("mscon_resume.check: ") and says in err[0], err


def test_the_module_runs_and_does_not_import_mindspore(tmp_path: Path) -> None:
    probe = "import sys, mscon_resume.check; print('mindspore' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
        == "False\n"
    )
    env = {**os.environ, "MSCON_RESUME": "1"}  # the user's own setting does not reach the first runs
    done = subprocess.run(
        [sys.executable, "-m", "mscon_resume.check", "--at", "3", "--", str(FAKE), "--steps", "8"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.match(r"resumes exactly \(rank 0 resumed after step \d; \d steps compared\)\n", done.stdout)


# ------------------------------------------------------------------ mscon check --resume


def mscon_check(*argv: str) -> int:
    """``mscon check ARGV`` in this process: its exit status, returned or raised by argparse."""
    from mscon.console.cli.main import main

    try:
        return main(["check", *argv])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def remote_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(
        "name: remote\ndevice_target: CPU\n"
        "nodes:\n  - {host: node7.example, name: n7, devices: 1}\n"
        f"job: {{workdir: {FAKE.parent}, script: {FAKE.name}}}\n"
    )
    return path


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--resume", "--", "no-such-script.py"], "mscon: script no-such-script.py: no such file"),
        (["--resume"], "mscon: --resume: give the script after --"),
        (["--at", "3", "--", str(FAKE)], "mscon: --at, --keep-dir: only with --resume"),
        (["--resume", "--at", "0", "--", str(FAKE)], "expected a step, 1 or more"),
        (["--resume", "--hosts", "a,b"], "mscon: --hosts: give the script after --"),
        (
            ["--resume", "--hosts", "a,b", "--nproc-per-node", "1", "--workdir", str(FAKE.parent)]
            + ["--skip-check", "x", "--", str(FAKE)],
            "mscon: --skip-check x: no such check",
        ),
        (["--resume", "--env", "NOEQUALS", "--", str(FAKE)], "mscon: --env NOEQUALS: expected KEY=VALUE"),
        (
            ["--resume", "--python", "/no/such/python", "--", str(FAKE)],
            "mscon: --python /no/such/python: no such",
        ),
    ],
)
def test_mscon_check_resume_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert mscon_check(*argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and says in err[0], err


def test_mscon_check_resume_takes_an_inventory_with_remote_nodes_to_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The check on the nodes (resume_check_nodes.py): its own refusals, before it connects."""
    inv = remote_inventory(tmp_path)
    assert mscon_check("--resume", str(inv), "--skip-check", "nosuch", "--", str(FAKE)) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--skip-check nosuch: no such check" in err[0], err
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "earlier").write_text("")
    assert mscon_check("--resume", str(inv), "--keep-dir", str(kept), "--", str(FAKE)) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"mscon: --keep-dir {kept}: not empty; give a new or empty folder"], err


def test_mscon_check_resume_passes_the_verdict_on(capfd: pytest.CaptureFixture[str]) -> None:
    # Steps of 0.3 s: the check's kill comes from its poll of the metrics, which a loaded machine
    # delays (at 0.02 s a step the fake ran to its end before the kill came).
    argv = ("--", str(FAKE), "--steps", "8", "--step-s", "0.3", "--mode", "differs")
    assert mscon_check("--resume", "--at", "3", *argv) == 1
    out = capfd.readouterr().out.splitlines()
    assert out[0].startswith("differs: rank 0 step "), out


def test_a_kill_ends_the_processes_a_run_started_in_sessions_of_their_own(tmp_path: Path) -> None:
    """As msrun starts its ranks (``os.setsid``): out of the run's process group."""
    pid_file = tmp_path / "rank.pid"
    script = tmp_path / "launcher.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "sleeper = [sys.executable, '-c', 'import time; time.sleep(120)']\n"
        "rank = subprocess.Popen(sleeper, start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(rank.pid))\n"
        "rank.wait()\n"
    )
    child = spawn([sys.executable, str(script)], dict(os.environ), tmp_path / "out.log")
    rank_pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the rank's pid"))
    assert child.poll() is None
    child.kill()
    assert child.poll() == -9
    assert not _alive(rank_pid)  # gone, or a zombie waiting for init (Child.kill waits for that)
