"""Real OpenSSH servers on loopback addresses, one per fake cluster "node".

Test helper (stdlib only).  ``start_sshd_cluster(workdir, n)`` starts ``n``
``/usr/sbin/sshd`` processes, node *i* listening on ``127.0.0.{i+2}`` (so
``node1`` is ``127.0.0.2``, ``node2`` is ``127.0.0.3``, ...), all on the same
port.  Everything they need -- host keys, configs, the client key, an
``authorized_keys`` file, a ``known_hosts`` file, pid files and logs -- lives
in ``workdir``; nothing under ``/root/.ssh`` or ``/etc/ssh`` is touched.  The
only path written outside ``workdir`` is ``/run/sshd`` (sshd's privilege
separation directory, which it refuses to start without).

Typical use::

    cluster = start_sshd_cluster(tmp_path, n=2)
    try:
        node = cluster.nodes[0]
        # ssh -i cluster.client_key -o UserKnownHostsFile=cluster.known_hosts \
        #     -p node.port root@node.host ...
        cluster.stop_node(node)        # node is now unreachable
        cluster.start_node(node)       # and back (new pid, see cluster.nodes)
        cluster.rotate_host_key(node)  # known_hosts no longer matches
    finally:
        cluster.stop()

The sshd processes run as root and accept only the generated client key for
user ``root``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "SSHD",
    "SSH_KEYGEN",
    "SshdCluster",
    "SshdError",
    "SshdNode",
    "SshdUnavailable",
    "find_free_port",
    "known_hosts_line",
    "descendants",
    "pid_alive",
    "require_sshd",
    "sshd_unavailable_reason",
    "start_sshd_cluster",
    "write_known_hosts",
]

#: sshd must be started by absolute path: it re-executes itself for every
#: connection and refuses to run otherwise ("sshd re-exec requires execution
#: with an absolute path").
SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")

START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0


class SshdError(RuntimeError):
    """An sshd could not be configured, started or stopped."""


class SshdUnavailable(SshdError):
    """OpenSSH server (or ssh-keygen) is not installed / usable here."""


@dataclass(frozen=True)
class SshdNode:
    """One sshd acting as a cluster node.

    ``pid`` is the pid of the listening sshd at the time this object was made;
    ``SshdCluster.start_node``/``rotate_host_key`` replace the entry in
    ``SshdCluster.nodes`` with a copy carrying the new pid.
    """

    name: str  # "node1", "node2", ...
    host: str  # "127.0.0.2", "127.0.0.3", ...
    port: int
    pid: int
    host_key: Path  # private host key (ed25519); public key at <host_key>.pub
    config: Path  # sshd_config
    pid_file: Path
    log: Path  # sshd's stderr (-e), LogLevel ERROR

    @property
    def host_key_pub(self) -> Path:
        return self.host_key.with_name(self.host_key.name + ".pub")

    @property
    def known_hosts_line(self) -> str:
        return known_hosts_line(self.host, self.port, self.host_key_pub)


@dataclass(frozen=True)
class SshdCluster:
    nodes: list[SshdNode]
    client_key: Path  # private ed25519 key authorized for root on every node
    known_hosts: Path  # one "[host]:port ssh-ed25519 AAAA..." line per node
    workdir: Path
    authorized_keys: Path  # the client public key, referenced by every sshd_config
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False, compare=False)

    # -- lookup ---------------------------------------------------------------

    def node(self, name_or_host: str) -> SshdNode:
        """The current ``SshdNode`` with that name ("node1") or host address."""
        for n in self.nodes:
            if name_or_host in (n.name, n.host):
                return n
        raise KeyError(name_or_host)

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def hosts(self) -> list[str]:
        return [n.host for n in self.nodes]

    def is_running(self, node: SshdNode | str) -> bool:
        proc = self._procs.get(self._name(node))
        return proc is not None and proc.poll() is None

    # -- lifecycle ------------------------------------------------------------

    def stop_node(self, node: SshdNode | str) -> None:
        """Stop one node's sshd and every session it spawned.

        Afterwards the node's address refuses connections (ECONNREFUSED).
        Idempotent.
        """
        name = self._name(node)
        proc = self._procs.pop(name, None)
        if proc is not None:
            _terminate_tree(proc)

    def start_node(self, node: SshdNode | str) -> SshdNode:
        """(Re)start a stopped node's sshd on the same address/port/host key.

        Returns the new ``SshdNode`` (new pid), which also replaces the old
        entry in ``self.nodes``.  Starting a running node is a no-op.
        """
        cur = self.node(self._name(node))
        if self.is_running(cur):
            return cur
        proc = _launch(cur.config, cur.log, cur.host, cur.port)
        self._procs[cur.name] = proc
        new = dataclasses.replace(cur, pid=proc.pid)
        self.nodes[self.nodes.index(cur)] = new
        return new

    def restart_node(self, node: SshdNode | str) -> SshdNode:
        self.stop_node(node)
        return self.start_node(node)

    def rotate_host_key(self, node: SshdNode | str) -> None:
        """Give the node a brand-new host key and restart its sshd.

        ``self.known_hosts`` is NOT updated, so clients using it now see a
        "host key changed" / not-verifiable host.  Call
        ``write_known_hosts(path, cluster.nodes)`` to get a matching file.
        """
        cur = self.node(self._name(node))
        self.stop_node(cur)
        for p in (cur.host_key, cur.host_key_pub):
            p.unlink(missing_ok=True)
        _keygen(cur.host_key, comment=f"{cur.name}-rotated")
        self.start_node(cur)

    def stop(self) -> None:
        """Terminate every sshd and all processes they forked; wait for them."""
        errors: list[str] = []
        for name in list(self._procs):
            try:
                self.stop_node(name)
            except Exception as e:  # keep stopping the others
                errors.append(f"{name}: {e}")
        if errors:
            raise SshdError("failed to stop: " + "; ".join(errors))

    def __enter__(self) -> SshdCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------

    def _name(self, node: SshdNode | str) -> str:
        if isinstance(node, SshdNode):
            return node.name
        return self.node(node).name


# ---------------------------------------------------------------------------
# availability


def sshd_unavailable_reason() -> str | None:
    """None if sshd + ssh-keygen are usable, else a human-readable reason."""
    if not os.path.isfile(SSHD) or not os.access(SSHD, os.X_OK):
        return f"OpenSSH server not installed ({SSHD} missing; apt-get install openssh-server)"
    if not os.path.isfile(SSH_KEYGEN) or not os.access(SSH_KEYGEN, os.X_OK):
        return "ssh-keygen not installed (apt-get install openssh-client)"
    if os.geteuid() != 0:
        return "sshd test nodes need root (they log in as root and use /run/sshd)"
    if _root_password_locked():
        # With UsePAM no, sshd refuses *all* logins (even by key) to an account
        # whose shadow password starts with "!" ("account is locked").
        return "root account is locked (/etc/shadow password starts with '!'); run: usermod -p '*' root"
    return None


def _root_password_locked() -> bool:
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == "root" and len(fields) > 1:
                return fields[1].startswith("!")
    except OSError:
        pass
    return False


def require_sshd() -> None:
    """``pytest.skip`` (with the reason) when sshd cannot be used here."""
    reason = sshd_unavailable_reason()
    if reason is not None:
        import pytest

        pytest.skip(reason)


# ---------------------------------------------------------------------------
# keys / known_hosts


def _keygen(path: Path, comment: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if r.returncode != 0:
        raise SshdError(f"ssh-keygen failed for {path}: {r.stderr.strip()}")
    os.chmod(path, 0o600)


def known_hosts_line(host: str, port: int, pubkey_file: Path) -> str:
    """``[host]:port keytype base64`` (plain ``host`` when port is 22)."""
    keytype, b64 = pubkey_file.read_text().split()[:2]
    target = host if port == 22 else f"[{host}]:{port}"
    return f"{target} {keytype} {b64}"


def write_known_hosts(path: Path, nodes: list[SshdNode]) -> Path:
    """Write a known_hosts file with every node's *current* host key."""
    path = Path(path)
    path.write_text("".join(n.known_hosts_line + "\n" for n in nodes))
    return path


# ---------------------------------------------------------------------------
# ports


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(hosts: list[str]) -> int:
    """A TCP port that can be bound now on every one of ``hosts``, and so can the two above it (as a
    scheduler port: its standby clusters take those, agent/protocol.py ``standby_port``). Below the
    ephemeral range, where no outgoing connection takes it between this call and its use."""
    import random

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start, end = 10000, max(10001, low - 3)
    # Side by side under xdist, each worker draws from its own slice: two tests' checks that a port
    # is free, made before either binds it, cannot pick the same one.
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        size = (end - start) // int(count)
        start += int(worker[2:]) * size
        end = start + size
    for _ in range(500):
        port = random.randrange(start, end)
        if all(_can_bind(h, p) for h in hosts for p in range(port, port + 3)):
            return port
    raise SshdError(f"no free run of three ports found on all of {hosts}")


# ---------------------------------------------------------------------------
# sshd config / process


def _sshd_config(host: str, port: int, host_key: Path, pid_file: Path, authorized_keys: Path) -> str:
    # Not read: /etc/ssh/sshd_config and its sshd_config.d includes (we use -f).
    # AcceptEnv is deliberately absent (default: accept no client env vars).
    return "\n".join(
        [
            f"ListenAddress {host}",
            f"Port {port}",
            "AddressFamily inet",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {authorized_keys}",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "PermitEmptyPasswords no",
            "AllowAgentForwarding no",
            "AllowTcpForwarding no",
            "X11Forwarding no",
            "PermitTunnel no",
            "PermitUserEnvironment no",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            "Subsystem sftp internal-sftp",
            "MaxStartups 100",
            "MaxSessions 100",
            "LoginGraceTime 30",
            "LogLevel ERROR",
            "",
        ]
    )


def _ensure_privsep_dir() -> None:
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


def _validate(config: Path) -> None:
    r = subprocess.run(
        [SSHD, "-t", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if r.returncode != 0:
        raise SshdError(f"sshd -t rejected {config}: {(r.stderr or r.stdout).strip()}")


def _log_tail(log: Path, lines: int = 20) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log empty)"


def _listening(pid: int, host: str, port: int) -> bool:
    """True once process ``pid`` holds a TCP socket listening on host:port.

    Read from /proc/net/tcp (+ /proc/PID/fd, so a foreign listener on the
    same address is not mistaken for our sshd) rather than by connecting: a
    probe connection makes sshd log "kex_exchange_identification: Connection
    closed by remote host" (ERROR), and if it gets as far as the version
    exchange, sshd's pre-auth child leaves an orphan that becomes a zombie
    under a PID 1 that does not reap (common in containers).  Falls back to
    connecting when /proc is unavailable.
    """
    try:
        table = Path("/proc/net/tcp").read_text()
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False
    want = f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"
    inodes = set()
    for line in table.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 9 and cols[1] == want and cols[3] == "0A":  # TCP_LISTEN
            inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def _launch(config: Path, log: Path, host: str, port: int) -> subprocess.Popen[bytes]:
    _ensure_privsep_dir()
    with open(log, "ab") as logf:
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
            start_new_session=True,  # own process group -> killpg in stop()
            close_fds=True,
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise SshdError(
                f"sshd for {host}:{port} exited with {proc.returncode} before "
                f"listening; log {log}:\n{_log_tail(log)}"
            )
        if _listening(proc.pid, host, port):
            return proc
        if time.monotonic() > deadline:
            _terminate_tree(proc)
            raise SshdError(
                f"sshd for {host}:{port} not accepting connections after "
                f"{START_TIMEOUT:.0f}s; log {log}:\n{_log_tail(log)}"
            )
        time.sleep(0.02)


def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may contain spaces/parens: fields after the last ')'
        rest = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(rest[1]), []).append(int(entry))
    return children


def _descendant_levels(pid: int) -> list[list[int]]:
    """Descendants of ``pid`` grouped by depth: [children, grandchildren, ...]."""
    tree = _proc_children()
    levels: list[list[int]] = []
    cur = list(tree.get(pid, []))
    while cur:
        levels.append(cur)
        cur = [c for p in cur for c in tree.get(p, [])]
    return levels


def descendants(pid: int) -> list[int]:
    """All current descendants of ``pid`` (from /proc; Linux only)."""
    return [p for level in _descendant_levels(pid) for p in level]


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2 :].split()[0]
    return state not in (b"Z", b"X")


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_until(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _kill_level(pids: list[int], wait_reaped: bool) -> None:
    """SIGTERM (then SIGKILL) ``pids``; optionally give parents time to reap."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            _kill(p, sig)
        if _wait_until(lambda: not any(pid_alive(p) for p in pids), STOP_TIMEOUT):
            break
    if wait_reaped:
        # Their parents are still running and reap them on SIGCHLD; wait a
        # little so they are not orphaned as zombies under a non-reaping PID 1.
        _wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 0.5)


def _terminate_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill the listening sshd, every process it forked, and wait for them.

    killpg alone is not enough: each per-connection sshd calls setsid() and
    so leaves the listener's process group (and session).  So:

    1. SIGSTOP the listener (no new connections are accepted/forked),
    2. walk its descendants via /proc and kill them deepest level first, so
       each dying process is reaped by its still-running parent,
    3. SIGTERM the listener's process group and SIGCONT it; it reaps its
       direct children on SIGCHLD and exits; we reap it (Popen.wait).
    """
    levels: list[list[int]] = []
    if proc.poll() is None:
        _kill(proc.pid, signal.SIGSTOP)
        levels = _descendant_levels(proc.pid)
        for depth in range(len(levels) - 1, -1, -1):
            _kill_level(levels[depth], wait_reaped=depth > 0)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            _kill(proc.pid, sig)
        _kill(proc.pid, signal.SIGCONT)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
            break
        except subprocess.TimeoutExpired:
            continue
    survivors = [p for level in levels for p in level if pid_alive(p)]
    if proc.poll() is None or survivors:
        raise SshdError(f"sshd {proc.pid} or its children {survivors} did not die")


# ---------------------------------------------------------------------------
# entry point


def start_sshd_cluster(workdir: Path, n: int = 2, port: int | None = None) -> SshdCluster:
    """Start ``n`` sshd "nodes" on 127.0.0.2 .. 127.0.0.{n+1}, same port.

    Raises ``SshdUnavailable`` if sshd is not installed (use ``require_sshd()``
    in tests to skip instead), ``SshdError`` if a node fails to start (with
    the tail of its log); already-started nodes are stopped in that case.
    """
    reason = sshd_unavailable_reason()
    if reason is not None:
        raise SshdUnavailable(reason)
    if not 1 <= n <= 250:
        raise ValueError(f"n must be in 1..250, got {n}")

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    hosts = [f"127.0.0.{i + 2}" for i in range(n)]
    if port is None:
        port = find_free_port(hosts)
    else:
        busy = [h for h in hosts if not _can_bind(h, port)]
        if busy:
            raise SshdError(f"port {port} is already in use on {', '.join(busy)}")

    client_key = workdir / "client_key"
    _keygen(client_key, comment="mscon-test-client")
    authorized_keys = workdir / "authorized_keys"
    authorized_keys.write_text(client_key.with_name("client_key.pub").read_text())
    os.chmod(authorized_keys, 0o600)

    _ensure_privsep_dir()
    planned: list[SshdNode] = []
    for i, host in enumerate(hosts):
        name = f"node{i + 1}"
        ndir = workdir / name
        ndir.mkdir(exist_ok=True)
        host_key = ndir / "ssh_host_ed25519_key"
        for p in (host_key, host_key.with_name(host_key.name + ".pub")):
            p.unlink(missing_ok=True)
        _keygen(host_key, comment=name)
        config = ndir / "sshd_config"
        pid_file = ndir / "sshd.pid"
        config.write_text(_sshd_config(host, port, host_key, pid_file, authorized_keys))
        _validate(config)
        planned.append(
            SshdNode(
                name=name,
                host=host,
                port=port,
                pid=0,
                host_key=host_key,
                config=config,
                pid_file=pid_file,
                log=ndir / "sshd.log",
            )
        )

    known_hosts = write_known_hosts(workdir / "known_hosts", planned)
    cluster = SshdCluster(
        nodes=planned,
        client_key=client_key,
        known_hosts=known_hosts,
        workdir=workdir,
        authorized_keys=authorized_keys,
    )
    try:
        for node in list(planned):
            cluster.start_node(node)
    except BaseException:
        cluster.stop()
        raise
    return cluster
