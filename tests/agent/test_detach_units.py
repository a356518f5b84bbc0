"""The node side of detach, piece by piece: the journal and log replay, the coordinator link's
authentication and signing, and the relay's reading of a run that ended."""

from __future__ import annotations

import json
import os
import queue
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mscon.agent import layout, tls
from mscon.agent import protocol as P
from mscon.agent.detached import coord
from mscon.agent.journal import Journal, log_lines, read_journal, write_state
from mscon.agent.tail import FileTail
from mscon.console.transport.link_tls import make_run_tls

# ------------------------------------------------------------------ journal and log replay


def test_log_replay_splits_lines_exactly_as_the_live_tail(tmp_path: Path) -> None:
    log = tmp_path / "r0.log"
    chunks = [
        b"one\ntwo\r\n",
        b"thr",
        b"ee\n" + b"x" * 20000 + b"\n",
        "caf\u00e9 \xff\n".encode("latin-1"),
        b"last, unterminated",
    ]
    tail = FileTail(str(log))
    live: list[str] = []
    with open(log, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            f.flush()
            live += tail.read_lines()
    assert len(live) == 5  # the unterminated line is still pending on the live side
    replayed = [line for batch in log_lines(str(log), 0, len(live)) for line in batch]
    assert replayed == live
    live += tail.read_lines(final=True)
    assert [line for batch in log_lines(str(log), 0) for line in batch] == live
    assert [line for batch in log_lines(str(log), 2, 4) for line in batch] == live[2:4]


def test_log_replay_batches_and_counts_from_start(tmp_path: Path) -> None:
    log = tmp_path / "r0.log"
    log.write_text("".join(f"line {i}\n" for i in range(1234)))
    batches = list(log_lines(str(log), 100))
    assert all(len(b) <= 500 for b in batches)
    flat = [line for b in batches for line in b]
    assert flat == [f"line {i}" for i in range(100, 1234)]


def test_journal_appends_counts_on_and_survives_a_torn_line(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    assert j.add(0, {"type": "proc_started", "name": "r0"}) == 0
    assert j.add(1, {"type": "proc_exited", "name": "r0"}) == 1
    j.close()
    again = Journal(str(tmp_path))  # an agent on the same folder goes on counting
    assert again.add(1, {"type": "all_exited"}) == 2
    again.close()
    with open(layout.journal_file(str(tmp_path)), "a") as f:
        f.write('{"i": 3, "a": 1, "m": {"type"')  # killed mid-write
    entries = list(read_journal(str(tmp_path)))
    assert [(i, a, m["type"]) for i, a, m in entries] == [
        (0, 0, "proc_started"),
        (1, 1, "proc_exited"),
        (2, 1, "all_exited"),
    ]
    assert [i for i, _, _ in read_journal(str(tmp_path), 2)] == [2]


# ------------------------------------------------------------------ the coordinator link


RUN_TLS = make_run_tls()


def _server(secret: str, nodes: list[str]) -> tuple[coord.CoordServer, queue.Queue]:
    inbox: queue.Queue = queue.Queue()
    return coord.CoordServer(secret, nodes, inbox, "127.0.0.1", cert=RUN_TLS.cert, key=RUN_TLS.key), inbox


def _dial(port: int, secret: str, node: str, inbox: queue.Queue, **kw: object) -> coord.PeerLink:
    return coord.dial("127.0.0.1", port, secret, node, inbox, cert=RUN_TLS.cert, key=RUN_TLS.key, **kw)


def _next(inbox: queue.Queue, kind: str, timeout: float = 5.0) -> tuple:
    deadline = time.monotonic() + timeout
    while True:
        item = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        if item[0] == kind:
            return item


def test_follower_and_coordinator_prove_the_secret_and_exchange_signed_lines() -> None:
    server, inbox = _server("s3cret", ["node2"])
    try:
        f_inbox: queue.Queue = queue.Queue()
        link = _dial(server.port, "s3cret", "node2", f_inbox)
        _, up, _ = _next(inbox, "peer_up")
        assert up.node == "node2"
        assert link.send({"type": "ping", "n": 1})
        assert _next(inbox, "peer")[2] == {"type": "ping", "n": 1}
        assert up.send({"type": "stop", "reason": "r1 failed"})
        assert _next(f_inbox, "peer")[2] == {"type": "stop", "reason": "r1 failed"}
        link.close()
        assert _next(inbox, "peer")[2] is None
    finally:
        server.close()


def test_wrong_secret_or_unknown_node_is_refused() -> None:
    server, inbox = _server("right", ["node2"])
    try:
        for secret, node in (("wrong", "node2"), ("right", "node9")):
            with pytest.raises((coord.LinkError, OSError)):
                _dial(server.port, secret, node, queue.Queue(), timeout_s=3)
        assert inbox.empty()
    finally:
        server.close()


def test_no_tls_material_or_no_address_is_an_error_never_a_clear_or_open_link() -> None:
    inbox: queue.Queue = queue.Queue()
    for host in ("", "0.0.0.0", "::"):
        with pytest.raises(coord.LinkError, match="scheduler's address"):
            coord.CoordServer("s", ["node2"], inbox, host, cert=RUN_TLS.cert, key=RUN_TLS.key)
    with pytest.raises(coord.LinkError, match="TLS"):
        coord.CoordServer("s", ["node2"], inbox, "127.0.0.1")
    with pytest.raises(coord.LinkError, match="TLS"):
        coord.dial("127.0.0.1", 9, "s", "node2", inbox)  # the positional form alone: refused


def test_a_fake_coordinator_cannot_command_a_follower() -> None:
    """A listener with the run's certificate but without the secret cannot answer the follower's
    challenge: nothing is accepted."""
    fake = socket.socket()
    fake.bind(("127.0.0.1", 0))
    fake.listen(1)
    port = fake.getsockname()[1]
    ctx = tls.server_context(RUN_TLS.cert, RUN_TLS.key)

    hung_up: list[bool] = []

    def serve() -> None:
        raw, _ = fake.accept()
        raw.settimeout(10)
        conn = ctx.wrap_socket(raw, server_side=True)
        conn.sendall(b'{"nonce": "00"}\n')
        conn.recv(4096)
        conn.sendall(b'{"mac": "' + b"0" * 64 + b'"}\n')
        # The link stays open until the follower hangs up: it refuses the bad answer itself, not
        # because the fake closed on it.
        try:
            while conn.recv(4096):
                pass
            hung_up.append(True)
        except OSError:
            pass
        conn.close()

    import threading

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    with pytest.raises(coord.LinkError):
        _dial(port, "secret", "node2", queue.Queue(), timeout_s=3)
    server.join(15)
    assert hung_up == [True], "the follower did not close the link it refused"
    fake.close()


def test_a_coordinator_with_another_certificate_is_refused_before_any_line() -> None:
    other = make_run_tls()
    inbox: queue.Queue = queue.Queue()
    server = coord.CoordServer("k", ["node2"], inbox, "127.0.0.1", cert=other.cert, key=other.key)
    try:
        with pytest.raises(ssl.SSLError):
            _dial(server.port, "k", "node2", queue.Queue(), timeout_s=3)
        assert inbox.empty()
    finally:
        server.close()


def test_tampered_or_replayed_lines_end_the_link() -> None:
    server, inbox = _server("k", ["node2"])
    try:
        link = _dial(server.port, "k", "node2", queue.Queue())
        _next(inbox, "peer_up")
        assert link.send({"type": "ping"})
        assert _next(inbox, "peer")[2] == {"type": "ping"}
        # Replay the first signed line (sequence 0) on the wire: refused, the link ends.
        body = json.dumps({"type": "ping"}, separators=(",", ":"), sort_keys=True)
        forged = json.dumps({"s": 0, "m": body, "t": coord._mac(link.key, "0", body)})
        link.sock.sendall(forged.encode() + b"\n")
        assert _next(inbox, "peer")[2] is None
    finally:
        server.close()


# ------------------------------------------------------------------ the relay on an ended run


def _agent_env() -> dict[str, str]:
    return dict(os.environ)  # the test's python has mscon installed: `-m mscon.agent` runs the agent


def _run_dir(home: Path, run_id: str) -> Path:
    """Node n0's folder of ``run_id`` for an agent whose HOME is ``home`` (attempt 0's folder made)."""
    run_dir = Path(layout.run_folder(layout.cache_folder(str(home)), run_id, "n0"))
    Path(layout.attempt_folder(run_dir, 0)).mkdir(parents=True)
    return run_dir


def test_relay_reads_an_ended_run_from_its_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_dir = _run_dir(home, "run-x")
    Path(layout.log_path(run_dir, 0, "r0")).write_text("a\nb\nc\n")
    j = Journal(str(run_dir))
    j.add(0, P.ProcStarted(node="n0", name="r0", rank=0, pid=1, ts_ns=1, log_path="x").to_dict())
    j.add(0, P.Coord(node="n0", kind=P.CoordKind.RUN_ENDED, attempt=0, outcome="succeeded").to_dict())
    j.close()
    write_state(str(run_dir), {"attempt": 0, "status": "succeeded", "pid": 999999999})
    relay = subprocess.run(
        [sys.executable, "-m", "mscon.agent", "--node", "n0", "--attach", "run-x"],
        input=P.encode(P.Attach(log_from={"r0": 1}, log_attempt=0)),
        capture_output=True,
        text=True,
        env={**_agent_env(), "HOME": str(home)},
        timeout=30,
    )
    msgs = [P.decode(line) for line in relay.stdout.splitlines() if line.strip()]
    kinds = [m.type for m in msgs]
    assert kinds == ["hello", "journaled", "journaled", "journal_done", "log", "replay_done"], kinds
    # The console names its cache folder: a $HOME that is not where it put the run does not matter.
    elsewhere = subprocess.run(
        [
            sys.executable,
            "-m",
            "mscon.agent",
            "--node",
            "n0",
            "--attach",
            "run-x",
            "--cache",
            layout.cache_folder(str(home)),
        ],
        input=P.encode(P.Attach(log_from={"r0": 1}, log_attempt=0)),
        capture_output=True,
        text=True,
        env={**_agent_env(), "HOME": str(tmp_path / "another-home")},
        timeout=30,
    )
    again = [P.decode(line) for line in elsewhere.stdout.splitlines() if line.strip()]
    assert [m.type for m in again] == kinds
    assert [m.lines for m in again if isinstance(m, P.LogBatch)] == [("b", "c")]
    done = msgs[3]
    assert isinstance(done, P.JournalDone) and done.live is False and done.entries == 2
    log = msgs[4]
    assert isinstance(log, P.LogBatch) and log.seq == 1 and log.lines == ("b", "c")
    listed = subprocess.run(
        [sys.executable, "-m", "mscon.agent", "--node", "n0", "--ls"],
        capture_output=True,
        text=True,
        env={**_agent_env(), "HOME": str(home)},
        timeout=30,
    )
    (info,) = [P.decode(line) for line in listed.stdout.splitlines()]
    assert isinstance(info, P.RunInfo) and info.run_id == "run-x" and info.status == "succeeded"


def test_replay_brings_the_last_metrics_for_the_charts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_dir = _run_dir(home, "run-m")
    # r0 prints LossMonitor lines (parsed), r1 writes MSCON_METRICS records (read as they are).
    Path(layout.log_path(run_dir, 0, "r0")).write_text(
        "".join(f"epoch: 1 step: {i}, loss is {1 / i:.4f}\n" for i in range(1, 601))
    )
    Path(layout.log_path(run_dir, 0, "r1")).write_text("hello\n")
    Path(layout.metrics_path(run_dir, 0, "r1")).write_text(
        "".join(json.dumps({"step": i, "loss": 2.0 / i, "ts": 1.0}) + "\n" for i in range(1, 11))
    )
    j = Journal(str(run_dir))
    for rank in (0, 1):
        j.add(0, P.ProcStarted(node="n0", name=f"r{rank}", rank=rank, pid=1, ts_ns=1, log_path="x").to_dict())
    j.close()
    write_state(str(run_dir), {"attempt": 0, "status": "succeeded"})
    relay = subprocess.run(
        [sys.executable, "-m", "mscon.agent", "--node", "n0", "--attach", "run-m"],
        input=P.encode(P.Attach(log_from={"r0": 600, "r1": 1}, log_attempt=0)),
        capture_output=True,
        text=True,
        env={**_agent_env(), "HOME": str(home)},
        timeout=30,
    )
    batches = {m.name: m for m in map(P.decode, relay.stdout.splitlines()) if isinstance(m, P.MetricBatch)}
    # Every log line was printed already (nothing replayed), yet the charts get their history.
    assert [m.step for m in batches["r0"].metrics] == list(range(89, 601))  # the last 512
    assert batches["r0"].metrics[-1].loss == pytest.approx(1 / 600, abs=1e-4)
    assert [m.step for m in batches["r1"].metrics] == list(range(1, 11))
    assert batches["r1"].metrics[0].source == "metrics"


def test_relay_refuses_a_run_id_that_is_not_a_plain_name(tmp_path: Path) -> None:
    relay = subprocess.run(
        [sys.executable, "-m", "mscon.agent", "--node", "n0", "--attach", "../../etc"],
        input="",
        capture_output=True,
        text=True,
        env={**_agent_env(), "HOME": str(tmp_path)},
        timeout=30,
    )
    msgs = [P.decode(line) for line in relay.stdout.splitlines() if line.strip()]
    assert [m.type for m in msgs] == ["hello", "agent_error"]
    assert "no run" in msgs[1].message
