"""What the console starts on a node to reach a detached run, and to list runs.

- ``relay``: connect to the run's agent socket and pass bytes both ways (stdin -> socket ->
  stdout), so the console speaks to the daemon exactly as to an agent it started. When no agent
  answers (the run ended, or its agent died), the run is read from its files instead: the same
  Hello, journal and log replay, then the end of output.
- ``ls``: one JSON line per run this node has in its cache folder.

Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import collections
import os
import socket
import sys
import threading
import time

from .. import protocol as P
from ..journal import RunStatus, agent_alive, log_lines, read_journal, read_state
from ..layout import SOCKET, attempt_folder, log_file, metrics_file, run_folder, runs_root, socket_file
from ..metrics import LineParser
from ..metrics import from_record as metric_from_record
from ..tail import LineMetrics, parse_metrics_line

_METRICS_KEPT = 512  # as many points as the console's charts keep per rank


def _write(msg: P.Message) -> None:
    os.write(1, P.encode(msg).encode("utf-8"))


def relay_main(node: str, run_id: str, cache: str | None = None) -> int:
    try:
        run_dir = run_folder(cache, run_id, node)
        os.chdir(run_dir)  # the socket is reached by its short relative name
    except (ValueError, OSError):
        _hello(node)
        _write(P.AgentError(node=node, message="no run %s on this node" % run_id))
        return 0
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(SOCKET)
    except PermissionError:
        _hello(node)
        _write(P.AgentError(node=node, message="the run's agent socket refused us (another user's run?)"))
        return 0
    except OSError:  # no socket, or nobody listening: the run is over (or its agent is gone)
        sock.close()
        return offline(node, run_dir)
    try:
        first = sock.recv(65536)  # the agent's Hello: the console says nothing before it
    except OSError:
        first = b""
    if not first:  # it took the connection and closed it unanswered: it is on its way out
        sock.close()
        return offline(node, run_dir)
    return _pump(sock, first)


def _pump(sock: socket.socket, first: bytes) -> int:
    def upstream() -> None:
        while True:
            try:
                chunk = os.read(0, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            try:
                sock.sendall(chunk)
            except OSError:
                break
        try:
            sock.shutdown(socket.SHUT_WR)  # the daemon sees this console leave
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    chunk = first
    while True:
        if not chunk:
            return 0
        view = memoryview(chunk)
        while view:
            try:
                n = os.write(1, view)
            except OSError:
                return 0  # the console is gone
            view = view[n:]
        try:
            chunk = sock.recv(65536)
        except OSError:
            chunk = b""


def hello(node: str, ssh_addr: str | None = None) -> P.Hello:
    """What every agent process says first: the relay, the agent, and a detached agent to a client."""
    return P.Hello(
        node=node,
        protocol=P.PROTOCOL_VERSION,
        pid=os.getpid(),
        hostname=socket.gethostname(),
        python=sys.version.split()[0],
        platform=_platform(),
        ssh_addr=ssh_addr,
    )


def _platform() -> str:
    """What platform.platform() says on Linux ("Linux-6.1.0-x86_64-with-glibc2.36"), without its
    cost at every agent start: it runs ``uname -p`` and reads the whole python binary for the libc."""
    u = os.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (ValueError, OSError):  # not glibc
        libc = ""
    return "-".join([u.sysname, u.release, u.machine] + (["with-" + libc.replace(" ", "")] if libc else []))


def _hello(node: str) -> None:
    _write(hello(node))


def _read_attach() -> P.Attach:
    pending = b""
    while b"\n" not in pending:
        chunk = os.read(0, 65536)
        if not chunk:
            return P.Attach(follow=False)
        pending += chunk
    try:
        msg = P.decode(pending.split(b"\n", 1)[0].decode("utf-8", "replace"))
    except P.ProtocolError:
        return P.Attach(follow=False)
    return msg if isinstance(msg, P.Attach) else P.Attach(follow=False)


def replay(
    node: str,
    run_dir: str,
    attach: P.Attach,
    send,  # noqa: ANN001
    live: bool,
    attempt: int,
    stops=None,  # noqa: ANN001
    metric_ends=None,  # noqa: ANN001
    line_metrics=None,  # noqa: ANN001
) -> None:
    """Send the journal from ``attach.journal_from``, then the logs: from ``attach.log_from`` in
    ``attach.log_attempt``, whole for each later attempt up to ``attempt``, then the last
    ``_METRICS_KEPT`` metrics of each process of ``attempt`` (the console's charts start full).

    A running agent passes where its live tail is: ``stops`` (lines of each log) and
    ``metric_ends`` (bytes of each MSCON_METRICS file); what follows comes live. Without them
    every file is read to its end."""
    entries = attach.journal_from
    names: dict = {}  # attempt -> its processes, in start order
    for index, att, msg in read_journal(run_dir, 0):
        if index >= attach.journal_from:
            send(P.Journaled(node=node, index=index, attempt=att, msg=msg))
            entries = index + 1
        name = msg.get("name")
        if (
            msg.get("type") == P.ProcStarted.type
            and isinstance(name, str)
            and name not in names.setdefault(att, [])
        ):
            names[att].append(name)
    send(P.JournalDone(node=node, entries=entries, attempt=attempt, live=live))
    for att in range(max(attach.log_attempt, 0), attempt + 1):
        log_dir = attempt_folder(run_dir, att)
        for name in names.get(att, []):
            rank = P.rank_of(name)
            if rank is None:
                continue  # not a name mscon gives a process (so never a path either)
            start = int(attach.log_from.get(name, 0) or 0) if att == attach.log_attempt else 0
            stop = stops.get(name) if stops is not None and att == attempt else None
            seq = start
            for batch in log_lines(log_file(log_dir, name), start, stop):
                send(
                    P.LogBatch(
                        node=node,
                        name=name,
                        rank=rank,
                        seq=seq,
                        lines=tuple(batch),
                        ts_ns=time.time_ns(),
                    )
                )
                seq += len(batch)
            if att == attempt:
                end = metric_ends.get(name) if metric_ends is not None else None
                _replay_metrics(node, name, rank, log_dir, stop, end, line_metrics, send)


def _replay_metrics(node, name, rank, log_dir, stop, end, line_metrics, send) -> None:  # noqa: ANN001
    """The process's last metrics: from its MSCON_METRICS file (up to ``end`` bytes), else parsed
    from its log (up to line ``stop``) as the live agent parses them."""
    kept: collections.deque = collections.deque(maxlen=_METRICS_KEPT)
    try:
        with open(metrics_file(log_dir, name), "rb") as f:
            data = f.read() if end is None else f.read(end)
    except OSError:
        data = None
    if data is not None:
        for raw in data.split(b"\n"):
            obj = parse_metrics_line(raw.decode("utf-8", "replace"))
            if obj is not None:
                kept.append(metric_from_record(node, name, rank, obj))
    else:
        parser = LineParser(node, name, rank, line_metrics or LineMetrics())
        for batch in log_lines(log_file(log_dir, name), 0, stop):
            for line in parser.line_metrics.candidates(batch):
                metric = parser.parse(line)
                if metric is not None:
                    kept.append(metric)
    if kept:
        send(P.MetricBatch(node=node, name=name, rank=rank, metrics=tuple(kept)))


def offline(node: str, run_dir: str) -> int:
    """The run's files, replayed as a live agent would (no agent runs for it any more)."""
    _hello(node)
    attach = _read_attach()
    state = read_state(run_dir) or {}
    attempt = int(state.get("attempt", 0) or 0)
    replay(node, run_dir, attach, _write, live=False, attempt=attempt)
    _write(P.ReplayDone(node=node))
    return 0


def _alive(run_dir: str) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_file(run_dir))
    except OSError:
        return False
    finally:
        sock.close()
    return True


def ls_main(node: str, cache: str | None = None) -> int:
    """A RunInfo line per run of this node, then the end of output."""
    root = runs_root(cache)
    try:
        run_ids = sorted(os.listdir(root))
    except OSError:
        run_ids = []
    for run_id in run_ids:
        try:
            run_dir = run_folder(cache, run_id, node)
        except ValueError:
            continue  # not a run folder mscon made
        state = read_state(run_dir)
        if state is None:
            continue
        status = state.get("status", RunStatus.RUNNING)
        live = False
        if status == RunStatus.RUNNING:
            live = (len(run_dir) < 100 and _alive(run_dir)) or agent_alive(state)
            if not live:
                status = RunStatus.LOST
        _write(
            P.RunInfo(
                node=node,
                run_id=run_id,
                status=str(status),
                attempt=int(state.get("attempt", 0) or 0),
                started=_num(state.get("started")),
                updated=_num(state.get("updated")),
                detached=bool(state.get("detached")),
                live=live,
                reason=str(state.get("reason", "")),
            )
        )
    return 0


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
