"""Every Python the console starts on its own machine ignores the folder it was started in: with a
plain ``-c`` or ``-m`` that folder comes first on sys.path, and a json.py, hmac.py or ssl.py planted
there would run with the user's rights (issue 45)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from mscon.console.cli import resume_check
from mscon.console.config.inventory import load_inventory
from mscon.console.engine.events import CheckStatus
from mscon.console.preflight.lint import lint

PLANTED = ("hmac", "json", "ssl")
_RUN = subprocess.run  # the real one: the test patches the module's


def _plant(folder: Path, markers: Path) -> None:
    """Modules that shadow the standard library's, each leaving a marker when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    markers.mkdir(parents=True, exist_ok=True)
    for name in PLANTED:
        marker = markers / name
        (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")


def _ran(markers: Path) -> list[str]:
    return sorted(p.name for p in markers.iterdir())


@pytest.mark.parametrize("mode", ["trainer", "parallel mode"])
async def test_the_config_lint_runs_nothing_planted_where_mscon_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    here, markers = tmp_path / "here", tmp_path / "markers"
    _plant(here, markers)
    monkeypatch.chdir(here)
    inv = load_inventory(REPO / "inventory" / "local.yaml")  # the repository's trainer, as a user runs it
    if mode == "trainer":
        result = await lint(inv, inv.job.script, inv.job.args, False)
    else:
        inv = dataclasses.replace(inv, job=dataclasses.replace(inv.job, script="mine.py"))
        result = await lint(inv, "mine.py", ("--parallel-mode", "data_parallel"), True)
    assert _ran(markers) == []
    assert result.status is CheckStatus.OK, result


def test_the_resume_check_runs_nothing_planted_where_mscon_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mscon check --resume`` starts ``mscon_resume.check`` in the job's Python: the command it
    makes, run from a folder holding the planted modules (``--help``: its imports, not a check)."""
    here, markers = tmp_path / "here", tmp_path / "markers"
    _plant(here, markers)
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('never run')\n")
    made: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        made.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(resume_check.subprocess, "run", fake_run)
    args = resume_check.argparse.Namespace(
        resume=True,
        hosts=None,
        hostfile=None,
        slurm=False,
        inventory=None,
        env=[],
        nproc_per_node=1,
        python=sys.executable,
        at=None,
        keep_dir=None,
    )
    monkeypatch.chdir(here)
    assert resume_check.resume_check_main(args, [str(script)]) == 0
    cmd = made[0]
    argv = cmd[: cmd.index("--")]
    proc = _RUN(argv, cwd=here, env=resume_check._with_library(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "mscon_resume.check: give the script after --" in proc.stderr, proc.stderr
    assert _ran(markers) == []
