"""The command line's edges (issue 33), as a new user meets them: a closed pipe, run ids that are
paths, runs that cannot be attached, validate against run, init's workdir, --json into nowhere,
each command's usage, one error prefix, and one list of exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_inventory
from mscon.console.cli import main as cli
from mscon.console.detach.record import DetachRecord, write_record
from mscon.console.engine import exit_codes
from mscon.console.engine.events import JobState, RunResult
from mscon.console.engine.summary import summary_file, write_summary


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current folder, with HOME an empty folder beside it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def _main(argv: list[str]) -> int:
    """``mscon ARGV`` in this process: its exit status, whether returned or raised by argparse."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def _one_error_line(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mscon: "), captured.err
    assert "error:" not in lines[0] and "Traceback" not in captured.err, captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _ssh_inventory(path: Path, workdir: str) -> Path:
    """An inventory of one SSH node (never reached: every check here comes before connecting), its
    script beside it."""
    (path.parent / "train.py").write_text("print('hi')\n")
    root = (path.parent / workdir).resolve()
    script = (path.parent / "train.py").relative_to(root).as_posix()
    doc = {
        "name": "edges",
        "device_target": "CPU",
        "nodes": [{"host": "node-a", "devices": 1}],
        "job": {"workdir": workdir, "script": script},
    }
    return write_inventory(path, doc)


# ------------------------------------------------------------------ 1. a closed stdout


def _with_closed_stdout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``mscon ARGS | true``: stdout a pipe whose reader is gone before mscon writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "mscon.console.cli", *args],
            cwd=cwd,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", [["completion", "bash"], ["ls"], ["--help"], ["ls", "--json"]])
def test_closed_stdout_exits_141_without_a_traceback(tmp_path: Path, argv: list[str]) -> None:
    done = _with_closed_stdout(*argv, cwd=tmp_path)
    assert done.returncode in (0, exit_codes.OUTPUT_CLOSED), done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_completion_piped_into_head_never_prints_a_traceback(tmp_path: Path) -> None:
    """``mscon completion bash | head -1``: the reader leaves after one line, mid-write or not."""
    for _ in range(4):
        p = subprocess.Popen(
            [sys.executable, "-m", "mscon.console.cli", "completion", "bash"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(60) in (0, exit_codes.OUTPUT_CLOSED), err
        assert "Traceback" not in err and "Exception ignored" not in err, err


# ------------------------------------------------------------------ 2. run ids are labels

BAD_RUN_IDS = ["../x", "/tmp/abs-run", "..", ".", "a b", "a/b", "a\x01b", "", "-x", "x" * 129]


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_run_id_flag_that_is_not_a_label_is_refused(
    here: Path, capsys: pytest.CaptureFixture[str], run_id: str
) -> None:
    inv = write_inventory(
        here / "inv.yaml",
        {
            "name": "ids",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": 1}],
            "job": {"workdir": str(REPO), "script": "bench/fake_rank.py", "args": ["--steps", "1"]},
        },
    )
    before = sorted(p.name for p in here.parent.iterdir())
    assert _main(["run", "--no-tui", "-q", "--no-check", str(inv), f"--run-id={run_id}"]) == 2
    _one_error_line(capsys, "--run-id", "letters, digits")
    assert sorted(p.name for p in here.parent.iterdir()) == before and os.listdir(here) == ["inv.yaml"]


@pytest.mark.parametrize("command", ["attach", "stop", "logs", "replay"])
@pytest.mark.parametrize("run_id", ["../x", "/tmp/abs-run", "..", "a b", "a\nb"])
def test_run_id_argument_that_is_not_a_label_is_refused(
    here: Path, capsys: pytest.CaptureFixture[str], command: str, run_id: str
) -> None:
    assert _main([command, run_id]) == 2
    _one_error_line(capsys, "RUN_ID", "letters, digits")
    assert os.listdir(here) == []


def test_generated_run_ids_are_labels() -> None:
    from mscon.console.engine.run_ids import candidates, generated_run_id, label_problem

    for run_id in [generated_run_id({}), generated_run_id({"SLURM_JOB_ID": "42"}), *candidates("a")[-2:]]:
        assert label_problem(run_id) is None, run_id


# ------------------------------------------------------------------ 3. attach what cannot be attached


def _past_run(logs: Path, run_id: str, status: JobState, detached: bool) -> None:
    folder = logs / run_id
    folder.mkdir(parents=True)
    result = RunResult(run_id, status, 0, "all ranks finished", None, (), 1.0, str(folder))
    write_summary(summary_file(folder), result)
    if detached:
        write_record(folder, DetachRecord(run_id, "inv.yaml", "train.py", (), 0))


@pytest.mark.parametrize("command", ["attach", "stop", "logs"])
def test_attach_stop_logs_of_a_run_never_detached_point_at_replay(
    here: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    _past_run(here / "mscon-runs", "done-1", JobState.SUCCEEDED, detached=False)
    assert _main([command, "done-1"]) == 2
    _one_error_line(capsys, "run done-1 was not detached", "mscon replay done-1")


@pytest.mark.parametrize("command", ["attach", "stop", "logs"])
def test_attach_stop_logs_of_a_detached_run_that_ended_point_at_replay(
    here: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    _past_run(here / "mscon-runs", "over-1", JobState.FAILED, detached=True)
    assert _main([command, "over-1"]) == 2
    _one_error_line(capsys, "run over-1 has ended (failed)", "mscon replay over-1")


def test_a_detached_run_still_goes_to_its_nodes(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Detached (its folder says so): the nodes are asked, through the inventory it recorded."""
    _past_run(here / "mscon-runs", "away-1", JobState.DETACHED, detached=True)
    assert _main(["stop", "away-1"]) == 2
    assert capsys.readouterr().err.startswith("inv.yaml: cannot read")  # an inventory's own form


# ------------------------------------------------------------------ 4. validate = run's checks


@pytest.mark.parametrize("where", ["root", "home"])
def test_validate_refuses_the_workdirs_run_refuses(
    here: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    home = Path(os.environ["HOME"])
    inv = _ssh_inventory(home / "inv.yaml", "/" if where == "root" else ".")
    assert _main(["run", "--no-tui", str(inv)]) == 2
    refused = capsys.readouterr().err.strip()
    assert "would be copied to every node" in refused
    assert _main(["validate", str(inv)]) == 2
    # validate's own form, the file first (as for every error it finds), then run's very words
    assert capsys.readouterr().err == f"{inv}: {refused.removeprefix('mscon: ')}\n"


def test_validate_accepts_a_workdir_run_accepts(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = _ssh_inventory(here / "inv.yaml", ".")
    assert _main(["validate", str(inv)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


# ------------------------------------------------------------------ 5. init writes workdir: .


def test_init_writes_the_current_folder_as_the_workdir(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (here / "trainer").mkdir()
    (here / "trainer" / "train.py").write_text("print('hi')\n")
    assert _main(["init"]) == 0
    text = (here / "mscon.yaml").read_text()
    assert re.search(r"^  workdir: \.\s", text, re.M), text
    assert "site-packages" not in text and str(REPO) not in text
    assert _main(["validate", "mscon.yaml"]) == 0


def test_init_without_a_script_here_asks_for_one(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["init"]) == 2
    _one_error_line(capsys, "give your script after --")
    assert os.listdir(here) == []


# ------------------------------------------------------------------ 6. --json into a missing folder


@pytest.mark.parametrize("command", ["run", "check", "attach", "stop"])
def test_json_into_a_missing_folder_is_refused(
    here: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    target = here / "no" / "such" / "out.json"
    argv = [command, "--json", str(target), "nope.yaml"]
    if command in ("attach", "stop"):
        argv = [command, "some-run", "nope.yaml", "--json", str(target)]
    assert _main(argv) == 2
    _one_error_line(capsys, "--json", "no such folder")
    assert os.listdir(here) == []


# ------------------------------------------------------------------ 7. usage names its command


def _commands() -> list[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", _commands())
def test_every_subcommand_usage_names_itself(capsys: pytest.CaptureFixture[str], command: str) -> None:
    assert _main([command, "--help"]) == 0
    usage = " ".join(capsys.readouterr().out.split())
    assert usage.startswith(f"usage: mscon {command} "), usage[:200]


# ------------------------------------------------------------------ 8. one error prefix


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--no-such-flag"],
        ["completion", "powershell"],
        ["no-such-command"],
        ["run", "--max-restarts", "x"],
        ["attach"],
        ["run", "--no-tui", "--max-restarts", "5000", "--no-check"],
        ["prune", "--keep", "-1"],
        ["init", "a/b/c/x.yaml"],
    ],
)
def test_one_error_prefix(here: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert _main(argv) == 2
    _one_error_line(capsys)


# ------------------------------------------------------------------ 9. one list of exit codes


def _words(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def test_exit_codes_are_the_same_in_the_help_the_readme_and_the_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mscon.console.cli.exit_table import AFTERWORD, EXIT_CODES

    constants = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    assert {code for code, _ in EXIT_CODES if code is not None} == constants
    assert _main(["--help"]) == 0
    help_text = _words(capsys.readouterr().out)
    readme = (REPO / "README.md").read_text()
    section = _words(readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0])
    assert _words(AFTERWORD) in help_text and _words(AFTERWORD) in section
    for code, meaning in EXIT_CODES:
        item = _words(f"{code} {meaning}" if code is not None else meaning)
        assert item in help_text, item
        assert item in section, item
    listed = {int(n) for n in re.findall(r"`(\d+)`", readme.split("## Exit codes", 1)[1].split("\n## ")[0])}
    assert listed == constants, listed
