"""The console in real terminals: tmux with two real MindSpore ranks, and a pty nobody reads."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import secrets
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from conftest import REPO, free_port, needs_mindspore, run_processes, wait_for, wait_gone, write_inventory
from tmux_screen import capture, wait_screen

needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"
)


def _env() -> dict[str, str]:
    env = dict(os.environ, TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    return env


@needs_tmux
@needs_mindspore
@pytest.mark.mindspore
def test_mscon_up_with_two_mindspore_ranks_in_tmux(tmp_path: Path) -> None:
    inv = write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "tui-tmux",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": 2}],
            "scheduler": {"port": free_port()},
            "job": {
                "workdir": str(REPO),
                "script": "trainer/train.py",
                "args": ["--parallel-mode", "data_parallel", "--epochs", "200", "--steps-per-epoch", "20"],
                "env": {"GLOG_v": "3"},
            },
            "stop": {"grace_s": 3},
        },
    )
    run_id = f"tui-tmux-{secrets.token_hex(3)}"
    session = f"mscon-tui-{secrets.token_hex(3)}"
    done = tmp_path / "done"
    env = " ".join(f"{k}={v}" for k, v in (("PYTHONPATH", os.environ.get("PYTHONPATH", "")),) if v)
    cmd = (
        f"cd {tmp_path} && env {env} TERM=xterm-256color {sys.executable} -m mscon.console.cli up {inv} "
        f"--run-id {run_id} --logs-dir {tmp_path / 'runs'}; echo exit=$? > {done}; sleep 60"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "45", cmd], check=True)
    try:
        wait_screen(session, lambda s: "Overview" in s and "Devices" in s, 60, "the console")
        subprocess.run(["tmux", "send-keys", "-t", session, "2"], check=True)

        def two_panes_with_loss(s: str) -> bool:
            return "r0 · local" in s and "r1 · local" in s and len(re.findall(r"loss \d+\.\d{4}", s)) >= 2

        screen = wait_screen(session, two_panes_with_loss, 180, "two rank panes with loss values")
        assert screen.count("● running") >= 2
        subprocess.run(["tmux", "send-keys", "-t", session, "?"], check=True)
        screen = wait_screen(session, lambda s: "Keys: Cluster" in s, 20, "the help")
        assert "Restart group" in screen and "Stop run" in screen and "Quit" in screen
        subprocess.run(["tmux", "send-keys", "-t", session, "Escape"], check=True)
        wait_screen(session, lambda s: "Keys: Cluster" not in s, 20, "the help to close")
        ranks = run_processes(run_id)
        assert len(ranks) >= 2
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        wait_screen(session, lambda s: "Quit mscon?" in s, 20, "the quit question")
        subprocess.run(["tmux", "send-keys", "-t", session, "s"], check=True)
        wait_for(done.exists, 60, "the console to finish", lambda: capture(session))
        assert done.read_text().strip() == "exit=130"
        assert wait_gone(ranks, 5) == [] and run_processes(run_id) == []
        assert "interrupted" in capture(session)  # the summary, printed after the console closed
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


# ``python -m mscon.console.cli ARGS`` whose terminal driver touches MARK (its first argument) when
# it drops its first frame: the frame queue is full, because the terminal stopped reading.
WATCHED_CONSOLE = """\
import sys
from pathlib import Path
from mscon.console.views.tui import terminal
mark = Path(sys.argv.pop(1))
write = terminal.NonBlockingDriver.write
def watched(self, data):
    write(self, data)
    if self.dropped_frames and not mark.exists():
        mark.touch()
terminal.NonBlockingDriver.write = watched
from mscon.console.cli.main import main
sys.exit(main())
"""


def test_a_terminal_nobody_reads_does_not_delay_a_stop(tmp_path: Path) -> None:
    """The engine shares the loop with the view: a frozen terminal must cost frames, never a stop."""
    inv = write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "tui-frozen",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": 4}],
            "scheduler": {"port": free_port()},
            "job": {
                "workdir": str(REPO),
                "script": "tests/tui/tui_rank.py",
                "args": ["--steps", "100000", "--rate", "20", "--lines-per-step", "2"],
            },
            "stop": {"grace_s": 2},
        },
    )
    run_id = f"tui-frozen-{secrets.token_hex(3)}"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 70, 250, 0, 0))
    dropped = tmp_path / "dropped-a-frame"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WATCHED_CONSOLE,
            str(dropped),
            "up",
            str(inv),
            "--run-id",
            run_id,
            "--no-check",
            "--logs-dir",
            str(tmp_path / "runs"),
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=tmp_path,
        env=_env(),
        start_new_session=True,
    )
    os.close(slave)
    try:

        def started() -> bool:
            assert proc.poll() is None, f"the console exited ({proc.returncode}) before its ranks started"
            return len(run_processes(run_id)) >= 4

        wait_for(started, 60, "the 4 ranks to start")

        # Nobody reads: the pty fills up, the driver's writer blocks on it, its frame queue fills and
        # the console starts dropping frames (every later frame finds it full).
        def dropping() -> bool:
            assert proc.poll() is None, f"the console exited ({proc.returncode}) before its terminal filled"
            return dropped.exists()

        wait_for(dropping, 60, "a dropped frame (the terminal never filled)")
        ranks = run_processes(run_id)
        t0 = time.monotonic()
        os.write(master, b"q")
        # "y" is the quit dialog's stop and means nothing on the main screen: pressed until the
        # dialog (up once the app has handled the "q") takes it and the first rank is gone.
        while len(wait_gone(ranks, 0.2)) == len(ranks):
            assert time.monotonic() - t0 < 10, "the stop waited for the terminal"
            os.write(master, b"y")
        assert wait_gone(ranks, 10) == [], "the stop waited for the terminal"
        took = time.monotonic() - t0
        assert took < 10
        # now read again: the console finishes and exits with the run's code
        end = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < end:
            try:
                os.read(master, 1 << 16)
            except OSError:
                break
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
