"""Detach, attach, ls and their errors on the local transport (fast fake ranks, no sshd)."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import kill_run, local_inventory, mscon, node_run_dir, run_processes, wait_for, wait_gone
from mscon.agent import layout

FAKE = "bench/fake_rank.py"


@pytest.fixture
def run_id() -> Iterator[str]:
    rid = f"local-detach-{secrets.token_hex(3)}"
    yield rid
    kill_run(rid)


def test_detach_then_attach_prints_every_line_once(tmp_path: Path, run_id: str) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, ["--steps", "80", "--rate", "20"])
    first = mscon("run", "--no-tui", "--detach", "--no-check", inv, "--run-id", run_id, cwd=tmp_path)
    assert first.code == 0, first.err
    assert f"mscon attach {run_id}" in first.err
    assert run_processes(run_id), "the ranks run on"
    second = mscon("attach", run_id, "--no-tui", cwd=tmp_path)  # no inventory: from the record
    assert second.code == 0, second.err
    for r in range(2):
        printed = re.findall(rf"^\[local r{r}\] (.*)$", first.out + second.out, re.M)
        log = Path(layout.log_path(tmp_path / layout.LOGS_DIR / run_id / "local", 0, f"r{r}"))
        assert printed == log.read_text().splitlines()
        steps = [int(s) for s in re.findall(r"step: (\d+),", "\n".join(printed))]
        assert steps == list(range(1, 81))
    assert wait_gone(run_processes(run_id), 5) == []
    listed = mscon("ls", inv, cwd=tmp_path)
    assert listed.code == 0
    row = next(line for line in listed.out.splitlines() if line.startswith(run_id))
    assert row.split()[1:3] == ["succeeded", "0"]


# An agent on its way out: its socket still takes a connection, which it closes unanswered, or after
# its Hello and the console's Attach. Bound relative to the run folder (an absolute path may pass the
# 107-byte limit of a socket's name).
_LAST_BREATH = """
import os, socket, sys
from mscon.agent import protocol
from mscon.agent.detached.relay import hello
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(1)
print("listening", flush=True)
conn, _ = s.accept()
if sys.argv[2] == "after-hello":
    conn.sendall(protocol.encode(hello("local")).encode())
    got = b""
    while b"\\n" not in got:
        got += conn.recv(4096) or b"\\n"
conn.close()
s.close()
os.unlink(sys.argv[1])
"""


@pytest.mark.parametrize("closes", ["unanswered", "after-hello"])
def test_attach_as_the_run_ends_reads_its_files(tmp_path: Path, run_id: str, closes: str) -> None:
    """The relay reaches the run's agent as it exits: the agent takes the connection and closes it,
    unanswered (the relay reads the run's files instead) or once it has said Hello (the console
    opens one more relay, which finds no agent and reads the files)."""
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, ["--steps", "5", "--rate", "50"])
    first = mscon("run", "--no-tui", "--detach", "--no-check", inv, "--run-id", run_id, cwd=tmp_path)
    assert first.code == 0, first.err
    run_dir = node_run_dir(run_id, "local", user=None)
    sock = Path(layout.socket_file(str(run_dir)))
    wait_for(lambda: not sock.exists() and not run_processes(run_id), 60, "the detached run to end")
    agent = subprocess.Popen(
        [sys.executable, "-c", _LAST_BREATH, layout.SOCKET, closes],
        cwd=run_dir,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline() == "listening\n"
        done = mscon("attach", run_id, "--no-tui", "--json", "-", cwd=tmp_path, timeout=60)
        assert agent.wait(timeout=30) == 0, "the relay never reached the socket"
    finally:
        agent.kill()
    assert done.code == 0, done.err
    assert json.loads(done.out)["status"] == "succeeded"
    assert "[local r1] training finished" in done.err


def test_attach_to_an_unknown_run_is_one_line(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, FAKE, [])
    done = mscon("attach", "no-such-run", inv, "--no-tui", cwd=tmp_path)
    assert done.code == 2
    assert done.err == (
        "mscon: no run no-such-run: not in ./mscon-runs and no node holds it (mscon ls lists runs)\n"
    )
    assert not (tmp_path / layout.LOGS_DIR).exists()


@pytest.mark.parametrize("bad", ["../etc", "a/b", ".", "x\ny"])
def test_run_ids_that_are_not_plain_names_are_refused(tmp_path: Path, bad: str) -> None:
    for command in ("attach", "stop", "logs"):
        done = mscon(command, bad, cwd=tmp_path)
        assert done.code == 2, (command, done.err)
        assert len(done.err.strip().splitlines()) == 1 and "run id" in done.err


def test_logs_follow_into_head_leaves_and_the_run_goes_on(tmp_path: Path, run_id: str) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, ["--steps", "3000", "--rate", "20"])
    first = mscon("run", "--no-tui", "--detach", "--no-check", inv, "--run-id", run_id, cwd=tmp_path)
    assert first.code == 0, first.err
    t0 = time.monotonic()
    piped = subprocess.run(
        f"{sys.executable} -m mscon.console.cli logs {run_id} -f | head -n 3",
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - t0 < 20, "a closed stdout ends `mscon logs -f`"
    assert len(piped.stdout.splitlines()) == 3
    assert run_processes(run_id), "the run goes on"
    stopped = mscon("stop", run_id, cwd=tmp_path)
    assert stopped.code == 130, stopped.err
    assert wait_gone(run_processes(run_id), 5) == []


def test_a_hundred_ls_leave_the_detached_run_untouched(tmp_path: Path, run_id: str) -> None:
    """Each `mscon ls` knocks on the detached agent's socket to see it is alive: a hundred of them
    leave no thread behind, and the ranks go on printing."""
    import asyncio

    from mscon.console.cli.runs import _list
    from mscon.console.config.inventory import load_inventory

    inv_path = local_inventory(tmp_path / "inv.yaml", 2, FAKE, ["--steps", "100000", "--rate", "20"])
    done = mscon("run", "--no-tui", "--detach", "--no-check", inv_path, "--run-id", run_id, cwd=tmp_path)
    assert done.code == 0, done.err
    run_dir = layout.run_folder(None, run_id, "local")
    agent = _detached_agent(run_dir)
    log = Path(layout.log_path(run_dir, 0, "r0"))
    before = agent.num_threads()
    inv = load_inventory(inv_path)

    async def many() -> list[str]:
        statuses = []
        for _ in range(100):
            runs, errors = await _list(inv, False)
            assert errors == []
            statuses += [r.status for r in runs if r.run_id == run_id]
        return statuses

    lines_before = len(log.read_text().splitlines())
    assert asyncio.run(many()) == ["running"] * 100
    # a client's threads end once its socket is closed
    wait_for(lambda: agent.num_threads() <= before + 1, 10, "the clients' threads to end", agent.num_threads)
    assert agent.is_running() and len(run_processes(run_id)) == 2
    wait_for(lambda: len(log.read_text().splitlines()) > lines_before + 5, 10, "the ranks to print on")


def _detached_agent(run_dir: str):  # noqa: ANN202 - psutil.Process
    import psutil

    def agent() -> psutil.Process | None:
        for p in psutil.process_iter(["cmdline"]):
            try:
                if any("mscon_agent" in w for w in p.info["cmdline"] or []) and p.cwd() == run_dir:
                    return p
            except psutil.Error:
                continue
        return None

    return wait_for(agent, 10, f"the detached agent in {run_dir}")
