"""``mscon completion``: scripts generated from the parser itself, so every command and flag is in them."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from mscon.console.cli.main import build_parser, main


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[arg-type]


def test_bash_script_names_every_command_and_is_valid_bash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    for command in _commands():
        assert command in script, command
    assert "--no-tui" in script and "--max-restarts" in script
    if shutil.which("bash"):
        done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("shell", ["zsh", "tcsh"])
def test_other_shells(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    assert "no-tui" in capsys.readouterr().out  # tcsh lists flags without their dashes


def test_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["completion", "powershell"])
    assert exc.value.code == 2
