"""The headless view in a real terminal (tmux): coloured rank prefixes, whole lines, the summary."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import local_inventory, wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"
)


def test_prefixes_are_coloured_in_a_terminal_and_plain_in_a_pipe(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, "bench/fake_rank.py", ["--steps", "3", "--rate", "0"])
    session = f"mscon-test-{tmp_path.name[-12:]}"
    done = tmp_path / "done"
    cmd = f"{sys.executable} -m mscon.console.cli run --no-tui {inv} 2>&1; echo exit=$? > {done}; sleep 30"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "50", cmd], check=True, cwd=tmp_path
    )
    try:
        wait_for(done.exists, 60, "mscon to finish in the terminal")
        screen = subprocess.run(
            ["tmux", "capture-pane", "-e", "-p", "-t", session], capture_output=True, text=True, check=True
        ).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert done.read_text().strip() == "exit=0"
    assert "\x1b[" in screen and "[local r1] \x1b[" in screen  # a coloured prefix, then the rank's text
    assert "succeeded" in screen and "exit code: 0" in screen
    piped = subprocess.run(
        [sys.executable, "-m", "mscon.console.cli", "run", "--no-tui", str(inv)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert (
        piped.returncode == 0
        and "\x1b[" not in piped.stdout
        and "[local r1] training finished" in piped.stdout
    )
