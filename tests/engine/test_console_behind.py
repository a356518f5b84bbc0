"""A console that falls behind its agents (a suspended or starved console): the nodes go on acting.

The console is stopped with SIGSTOP while two fast ranks flood it, and one of them fails. Its agent
stops the sibling at once instead of waiting for the console to read again (the lines it cannot
send yet wait in the logs); once the console resumes it names the failure and prints every line.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import kill_run, local_inventory, wait_gone, wait_run_processes
from mscon.agent import layout

FAKE = "bench/fake_rank.py"


def test_a_suspended_console_does_not_stall_its_agents(tmp_path: Path) -> None:
    run_id = f"behind-{secrets.token_hex(3)}"
    # 2 x 20,000 lines a second; r1 fails after about 4 s.
    args = ["--steps", "100000000", "--rate", "2000", "--lines-per-step", "9"]
    inv = local_inventory(
        tmp_path / "inv.yaml", 2, FAKE, [*args, "--fail-rank", "1", "--fail-step", "8000", "--fail-code", "7"]
    )
    out = (tmp_path / "out.txt").open("w")
    err = (tmp_path / "err.txt").open("w")
    console = subprocess.Popen(
        [sys.executable, "-m", "mscon.console.cli", "run", "--no-tui", "--no-check", str(inv)]
        + ["--run-id", run_id, "--json", str(tmp_path / "s.json")],
        cwd=tmp_path,
        stdout=out,
        stderr=err,
    )
    try:
        # the two ranks (one node: no scheduler process)
        ranks = wait_run_processes(run_id, 2, 60)
        console.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            # r1 fails about 4 s in; its agent stops r0 while the console is still stopped.
            left = wait_gone(ranks, 20)
            assert left == [], f"still running with the console stopped: {[p.cmdline() for p in left]}"
            gone_after = time.monotonic() - t0
        finally:
            console.send_signal(signal.SIGCONT)
        assert console.wait(timeout=60) == 7
    finally:
        if console.poll() is None:
            console.kill()
        kill_run(run_id)
        out.close()
        err.close()
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["root_cause"]["name"] == "r1" and s["root_cause"]["exitcode"] == 7
    for rank in ("r0", "r1"):
        log = Path(layout.log_path(tmp_path / layout.LOGS_DIR / run_id / "local", 0, rank))
        printed = [
            line.removeprefix(f"[local {rank}] ")
            for line in (tmp_path / "out.txt").read_text().splitlines()
            if line.startswith(f"[local {rank}] ")
        ]
        assert printed == log.read_text().splitlines()  # every line, once, in order
    print(f"\nsibling stopped {gone_after:.1f} s after the console was suspended")
