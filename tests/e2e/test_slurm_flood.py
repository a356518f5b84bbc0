"""A Slurm run through a sustained flood at the console's dial port (issue 45, item 3): 2,000
connections that never authenticate, from the node's own address (127.0.0.1: the console listens
there, MSCON_CONSOLE_ADDRESS) and from 64 others, kept open from before the node dials until the
run ends. The node's dial gets in, and when its dial is killed mid-run the restart's new step
dials in again under the flood: no attempt fails but the one whose node was killed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
from conftest import mscon_popen, wait_for
from flood import Flood, raise_nofile
from mscon.console.transport.slurm_launcher import ENV_CONSOLE_ADDRESS
from test_slurm import FAKE, Alloc, _dials, _inventory, _wait_for_line, _wait_no_step, alloc, slurm

__all__ = ["alloc", "slurm"]  # the fixtures, from test_slurm.py


def _dial_port(pid: int) -> int | None:
    """The console's listening TCP port on 127.0.0.1 (its dial port), once it listens."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.ip == "127.0.0.1":
            return int(c.laddr.port)
    return None


def test_a_slurm_run_keeps_its_node_through_2000_connections_from_65_addresses(
    tmp_path: Path, alloc: Alloc
) -> None:
    raise_nofile(2000 + 1024)
    node = alloc.cluster.node
    inv = _inventory(tmp_path / "inv.yaml", FAKE, ["--steps", "200", "--rate", "20"])
    env = dict(alloc.env, **{ENV_CONSOLE_ADDRESS: "127.0.0.1"})
    proc = mscon_popen(
        "run", "--no-tui", "--no-check", inv, "--max-restarts", "1", "--json", tmp_path / "s.json",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    flood = None
    try:
        port = wait_for(lambda: _dial_port(proc.pid), 60, "the console's dial port")
        sources = ["127.0.0.1"] + [f"127.0.1.{i}" for i in range(1, 65)]
        flood = Flood("127.0.0.1", port, sources, 2000)
        _wait_for_line(proc, f"[{node} r", "r0] epoch: 1 step: 3,")
        assert flood.opened >= 2000, f"the flood opened only {flood.opened} before the node got in"
        dials = _dials(alloc, node)
        assert len(dials) == 1, dials
        closed_before = flood.closed
        dials[0].kill()  # the node is lost: the restart's step dials in again, under the flood
        _, err = proc.communicate(timeout=180)
        assert flood.closed > closed_before, "the flood stopped before the restart's dial"
    finally:
        if flood is not None:
            flood.stop()
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert [a["outcome"] for a in s["attempts"]] == ["failed", "succeeded"], s["attempts"]
    assert s["attempts"][0]["reason"].startswith(f"lost the node {node}:"), s["attempts"][0]
    assert not flood.errors, flood.errors
    t0 = time.monotonic()
    assert _wait_no_step(alloc, 10) == [], f"a step left {time.monotonic() - t0:.1f} s after the end"
