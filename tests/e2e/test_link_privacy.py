"""Issue 33: every TCP link mscon opens is private and authenticated both ways, seen from outside.

A loopback capture (tcpdump) of each link while a real run crosses it: the Slurm dial-back (the
test Slurm cluster) and a detached run's coordinator link (two sshd nodes). Neither capture may
hold the job's argv values, env values or log lines, nor (the coordinator link) the node names
and message fields its old clear-text lines carried. The same run takes a flood of 2,000
connections that never authenticate to the listening port and still completes with verdict ok.
A control test shows the capture method sees what is sent in clear.
"""

from __future__ import annotations

import json
import secrets
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import (
    REPO,
    agent_processes,
    kill_run,
    mscon,
    mscon_popen,
    run_processes,
    ssh_inventory,
    wait_for,
)
from link_capture import Capture, flood, leaks, on_port, tcpdump_unavailable_reason
from mscon.agent import layout
from mscon.console.transport.slurm_launcher import ENV_CONSOLE_ADDRESS
from sshd_nodes import SshdCluster
from test_slurm import Alloc, _inventory, alloc, slurm  # noqa: F401 - the Slurm fixtures, reused

CONSOLE_ADDRESS = "127.0.33.1"  # the console's Slurm port on an address of its own: one filter
FLOOD = 2000

needs_tcpdump = pytest.mark.skipif(bool(tcpdump_unavailable_reason()), reason=tcpdump_unavailable_reason())


class Probe:
    """A job whose argv, env and log lines are each a distinctive string: a wrapper of the fake
    rank that prints its log marker (not literally in its argv, env or source), then trains."""

    def __init__(self, workdir: Path) -> None:
        token = secrets.token_hex(6)
        self.argv = f"argvprobe{token}"
        self.env = f"envprobe{token}"
        self.log = f"logprobe{token[::-1]}"  # what the script prints, built from the env value
        workdir.mkdir(parents=True, exist_ok=True)
        fake = REPO / "bench" / "fake_rank.py"
        (workdir / "probe_rank.py").write_text(
            textwrap.dedent(
                f"""
                import os, runpy, sys, threading, time
                marker = "logprobe" + os.environ["PRIVACY_PROBE"][len("envprobe"):][::-1]
                sys.argv = [sys.argv[0]] + [a for a in sys.argv[1:] if not a.startswith("argvprobe")]
                def tick():  # the marker all along the run: one write per line, never torn
                    for i in range(100000):
                        sys.stdout.write("%s %d\\n" % (marker, i))
                        sys.stdout.flush()
                        time.sleep(0.25)
                threading.Thread(target=tick, daemon=True).start()
                runpy.run_path({str(fake)!r}, run_name="__main__")
                """
            )
        )

    def needles(self) -> list[bytes]:
        return [self.argv.encode(), self.env.encode(), self.log.encode()]


def test_the_capture_sees_what_crosses_in_clear(tmp_path: Path) -> None:
    """The capture method can fail the tests below: a string sent in clear is found in it."""
    if tcpdump_unavailable_reason():
        pytest.skip(tcpdump_unavailable_reason())
    needle = f"clearprobe{secrets.token_hex(6)}".encode()
    with socket.create_server((CONSOLE_ADDRESS, 0)) as srv:
        port = srv.getsockname()[1]
        with Capture(tmp_path / "clear.pcap", f"tcp and host {CONSOLE_ADDRESS} and port {port}") as cap:
            with socket.create_connection((CONSOLE_ADDRESS, port), 5) as c:
                conn, _ = srv.accept()
                with conn:
                    c.sendall(b"a line: " + needle + b"\n")
                    assert conn.recv(100).endswith(needle + b"\n")
            flows = cap.stop()
    assert leaks(on_port(flows, port), [needle]), "the capture did not see a string sent in clear"


def _listening(pids: list[int], address: str) -> list[int]:
    ports = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections("tcp")
        except psutil.Error:
            continue
        ports += [c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.ip == address]
    return ports


def _wait_port(find, what: str, timeout: float = 60) -> int:  # noqa: ANN001
    return wait_for(find, timeout, f"a {what} listening")[0]


@needs_tcpdump
def test_a_slurm_run_is_private_on_its_link_and_a_flood_leaves_it_untouched(
    tmp_path: Path,
    alloc: Alloc,  # noqa: F811 - the fixture imported above
) -> None:
    probe = Probe(tmp_path / "work")
    inv = _inventory(tmp_path / "inv.yaml", "probe_rank.py", [probe.argv, "--steps", "400", "--rate", "20"])
    doc = yaml.safe_load(inv.read_text())
    doc["job"]["workdir"] = str(tmp_path / "work")
    doc["defaults"]["env"] = {**doc["defaults"].get("env", {}), "PRIVACY_PROBE": probe.env}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**alloc.env, ENV_CONSOLE_ADDRESS: CONSOLE_ADDRESS}
    with Capture(tmp_path / "slurm.pcap", f"tcp and host {CONSOLE_ADDRESS}") as cap:
        proc = mscon_popen(
            "run", "--no-tui", "--no-check", inv, "--json", tmp_path / "s.json", cwd=tmp_path, env=env
        )
        try:
            port = _wait_port(lambda: _listening([proc.pid], CONSOLE_ADDRESS), "console port")
            result = flood(CONSOLE_ADDRESS, port, FLOOD)
            out, err = proc.communicate(timeout=240)
        finally:
            proc.kill()
        flows = cap.stop()
    assert proc.returncode == 0, err[-3000:]
    assert result.opened + result.refused == FLOOD and result.refused == 0, result
    summary = json.loads((tmp_path / "s.json").read_text())
    assert sorted(r["last_step"] for r in summary["ranks"] if r["rank"] >= 0) == [400, 400]
    assert probe.log in out, "the probe's log line did not reach the console"
    link = on_port(flows, port)
    assert sum(map(len, link.values())) > 100_000, "the link's traffic was not captured"
    assert leaks(flows, probe.needles()) == []
    # Every flow of the nodes' connections begins with a TLS handshake record (asked of the flows
    # captured from their start: a starved tcpdump may have dropped the first packets of one).
    whole = [v for k, v in link.items() if k[3] == port and len(v) > 1000 and k not in cap.partial]
    assert whole and all(v[:1] == b"\x16" for v in whole), [v[:8] for v in whole]
    print(f"slurm link: {sum(map(len, link.values()))} bytes captured, flood {result}")


@pytest.fixture
def run_id() -> Iterator[str]:
    rid = f"privacy-{secrets.token_hex(3)}"
    yield rid
    kill_run(rid)  # a failed test must not leave a detached run training


@pytest.mark.ssh
@needs_tcpdump
def test_a_detached_run_is_private_on_its_link_and_a_flood_leaves_it_untouched(
    tmp_path: Path, sshd_cluster: SshdCluster, run_id: str
) -> None:
    probe = Probe(tmp_path / "work")
    inv = ssh_inventory(
        tmp_path / "inv.yaml",
        sshd_cluster,
        1,
        "probe_rank.py",
        [probe.argv, "--steps", "400", "--rate", "20"],
        workdir=tmp_path / "work",
    )
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"]["env"] = {**doc["defaults"].get("env", {}), "PRIVACY_PROBE": probe.env}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    coord_host = sshd_cluster.nodes[0].host
    bpf = f"tcp and host {coord_host} and not port {sshd_cluster.port}"
    with Capture(tmp_path / "detach.pcap", bpf) as cap:
        done = mscon(
            "run", "--no-tui", "--detach", "--no-check", inv, "--run-id", run_id, cwd=tmp_path, timeout=60
        )
        assert done.code == 0, done.err

        def coordinator_ports() -> list[int]:
            agents = [p.pid for p in agent_processes([]) if _in_run(p, run_id)]
            return _listening(agents, coord_host)

        port = _wait_port(coordinator_ports, "coordinator port")
        result = flood(coord_host, port, FLOOD)
        assert run_processes(run_id), "the run did not outlive the flood"
        attached = mscon("attach", run_id, "--no-tui", cwd=tmp_path, timeout=240)
        flows = cap.stop()
    assert attached.code == 0 and "succeeded" in attached.err, attached.err[-3000:]
    assert result.opened == FLOOD, result
    fetched = tmp_path / layout.LOGS_DIR / run_id / "node1"
    assert probe.log in Path(layout.log_path(fetched, 0, "r0")).read_text(), "the probe printed no line"
    link = {k: v for k, v in on_port(flows, port).items() if len(v) > 1000}  # the follower's, both ways
    assert link, "the coordinator link's traffic was not captured"
    # What the old clear-text link carried: node names, handshake and message fields.
    old_clear = [b"node1", b"node2", b'"nonce"', b'"type"', b'"mac"']
    assert leaks(flows, probe.needles()) == []
    assert leaks(link, old_clear) == []
    whole = [v for k, v in link.items() if k[3] == port and k not in cap.partial]  # see the Slurm case
    assert whole and all(v[:1] == b"\x16" for v in whole), [v[:8] for v in whole]
    print(f"coordinator link: {sum(map(len, link.values()))} bytes captured, flood {result}")


def _in_run(p: psutil.Process, run_id: str) -> bool:
    try:
        return run_id in p.cwd()
    except psutil.Error:
        return False
