"""``port``: the scheduler port can be bound on the first node (n/a elsewhere), and who holds it
when it cannot."""

from __future__ import annotations

import errno
import os
import socket

from ..procs import psutil_module
from .params import Params
from .results import FAIL, NA, OK, WARN, oneline, result
from .tools import proc_name


def check_port(p: Params) -> list:
    if not p.is_first:
        return [result("port", NA, detail="the scheduler runs on the first node")]
    port = p.sched_port
    if port is None or not 0 < port < 65536:
        return [result("port", NA, detail="no scheduler port given")]
    hosts = ["0.0.0.0"]
    if p.sched_host and p.sched_host not in hosts:
        hosts.append(p.sched_host)
    for host in hosts:
        try:
            infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            return [
                result(
                    "port",
                    FAIL,
                    "%s does not resolve" % host,
                    "give scheduler.host as an IP address of the first node",
                    str(exc),
                )
            ]
        for family, kind, proto, _canon, addr in infos[:1]:
            err = _try_bind(family, kind, proto, addr)
            if err is None:
                continue
            if err.errno == errno.EADDRINUSE:
                holder = port_holder(port)
                return [
                    result(
                        "port",
                        FAIL,
                        "%d in use%s" % (port, " by " + holder if holder else ""),
                        "choose another scheduler.port, or stop the process holding %d" % port,
                        "binding %s:%d: %s" % (addr[0], port, err.strerror),
                    )
                ]
            if err.errno == errno.EADDRNOTAVAIL:
                return [
                    result(
                        "port",
                        WARN,
                        "%s is not an address of this node" % addr[0],
                        "set scheduler.host (or the first node's address) to an IP of this node",
                        "MindSpore's scheduler binds MS_SCHED_HOST:%d; it would fail here" % port,
                    )
                ]
            return [
                result(
                    "port", FAIL, "%s:%d: %s" % (addr[0], port, err.strerror), "choose another scheduler.port"
                )
            ]
    return [result("port", OK, "%d free" % port, detail="bound on %s" % ", ".join(hosts))] + _standby(
        p, hosts
    )


def _standby(p: Params, hosts: list) -> list:
    """The standby clusters' ports: one in use costs no run, only the speed of its restarts."""
    busy, kept = [], []
    for port in p.standby_ports:
        for host in hosts:
            try:
                infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
            except (OSError, UnicodeError):
                continue
            err = _try_bind(*infos[0][:3], infos[0][4]) if infos else None
            if err is not None and err.errno == errno.EADDRINUSE:
                pid = _holder_pid(port)
                if pid is not None and _is_spare(pid):  # mscon's own standby: one a last run kept
                    kept.append(str(port))
                else:
                    holder = _describe_holder(pid)
                    busy.append("%d%s" % (port, " (held by %s)" % holder if holder else ""))
                break
    if not p.standby_ports:
        return []
    if kept and not busy:
        return [
            result(
                "standby port",
                OK,
                "%s held by mscon's standby kept by a last run: this run takes it if it fits, else ends it"
                % ", ".join(kept),
            )
        ]
    if busy:
        return [
            result(
                "standby port",
                WARN,
                "%s in use: a restart would start cold" % ", ".join(busy),
                "choose a scheduler.port whose next two ports are free, or set restart.standby: imported",
                "a standby cluster's scheduler binds scheduler.port + 1 or + 2",
            )
        ]
    return [result("standby port", OK, "%s free" % ", ".join(map(str, p.standby_ports)))]


def _try_bind(family: int, kind: int, proto: int, addr: tuple) -> OSError | None:
    s = socket.socket(family, kind, proto)
    try:
        # As servers do: a TIME_WAIT left by the last run is no obstacle, a listener is.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen(1)
        return None
    except OSError as exc:
        return exc
    finally:
        s.close()


def port_holder(port: int) -> str:
    """'pid 1234 (python3 ...)' of the process listening on the TCP port, where it can be told."""
    return _describe_holder(_holder_pid(port))


def _describe_holder(pid: int | None) -> str:
    return "" if pid is None else "pid %d (%s)" % (pid, _describe_pid(pid))


def _is_spare(pid: int) -> bool:
    """The process is a standby spare (``python .../spare_boot.py``): its whole command line is
    read, as a description cut to a line could lose the script's name behind a long interpreter path."""
    argv = _argv(pid)
    return any(a == b"spare_boot.py" or a.endswith(b"/spare_boot.py") for a in argv[1:3])


def _argv(pid: int) -> list:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _holder_pid(port: int) -> int | None:
    pid = None
    psutil = psutil_module()  # optional on nodes: without it /proc is read
    if psutil is not None:
        try:
            for c in psutil.net_connections(kind="inet"):
                if c.laddr and c.laddr[1] == port and c.status == psutil.CONN_LISTEN and c.pid:
                    pid = c.pid
                    break
        except Exception:  # AccessDenied on some systems: try /proc
            pid = None
    if pid is None:
        pid = _proc_port_holder(port)
    return pid


def _describe_pid(pid: int) -> str:
    cmd = b" ".join(_argv(pid)).decode("utf-8", "replace").strip()
    if cmd:
        return oneline(cmd, 120)
    return proc_name(pid).strip() or "?"


def _proc_port_holder(port: int) -> int | None:
    """The pid owning a listening socket on the port, via /proc/net/tcp{,6} and /proc/*/fd."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[3] != "0A":  # 0A: TCP_LISTEN
                        continue
                    if int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except (OSError, ValueError, IndexError):
            continue
    if not inodes:
        return None
    targets = {"socket:[%s]" % i for i in inodes}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in targets:
                    return pid
            except OSError:
                continue
    return None
