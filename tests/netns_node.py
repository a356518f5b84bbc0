"""An sshd "node" inside a network namespace of its own, so a test can cut its network.

Test helper (stdlib only, Linux, root). ``start_netns_node(workdir, client_key)`` creates a
namespace, a veth pair with one end inside it, addresses from a private /30 of 10.213.0.0/16 (they
exist only on this pair: nothing outside this machine is ever addressed), and starts
``/usr/sbin/sshd`` inside the namespace on the inner address. The root namespace reaches it
through the pair; ``partition()`` takes both ends of the pair down (packets are dropped, nothing
is closed or reset: exactly what a pulled cable looks like to both sides), ``heal()`` brings them
back. A blackhole route for the pair's /30 (under the connected route) keeps packets for the
node from following the default route off this machine while the pair is down. ``stop()`` kills
every process in the namespace and removes the pair, the namespace and the route.

The node's sshd sends client-alive probes (``ClientAliveInterval 1``, ``ClientAliveCountMax 2``),
like a well-configured cluster node, but OpenSSH 9.2 only probes a session that is idle: one whose
command keeps writing (an agent streaming rank output) is not dropped during a partition until its
buffers fill up. The processes behind it learn that the console is gone when its FIN or RST gets
through, i.e. once the partition heals (``heal()``).

Typical use::

    reason = netns_unavailable_reason()
    node = start_netns_node(tmp_path / "ns", client_key=cluster.client_key)
    try:
        ...  # ssh root@node.host -p node.port -i client_key
        node.partition()
    finally:
        node.stop()
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from sshd_nodes import SSHD, _keygen, _sshd_config, _validate, known_hosts_line, sshd_unavailable_reason

__all__ = ["NetnsError", "NetnsNode", "netns_unavailable_reason", "start_netns_node"]

IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "/sbin/ip"
SUBNET = ipaddress.ip_network("10.213.0.0/16")  # private; a /30 of it per node
START_TIMEOUT = 10.0


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    return r


def netns_unavailable_reason() -> str | None:
    """None when network namespaces and veth pairs can be made here, else why not."""
    reason = sshd_unavailable_reason()
    if reason is not None:
        return reason
    if not os.path.exists(IP):
        return "iproute2 is not installed (no ip command)"
    probe = f"mscon-probe-{secrets.token_hex(3)}"
    try:
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"network namespaces are not allowed here: ip netns add: {r.stderr.strip()}"
        a, b = f"msp{secrets.token_hex(3)}", f"msq{secrets.token_hex(3)}"
        r = _ip("link", "add", a, "type", "veth", "peer", "name", b, check=False)
        if r.returncode != 0:
            return f"veth pairs are not allowed here: ip link add: {r.stderr.strip()}"
        _ip("link", "del", a, check=False)
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of SUBNET no interface or route of the root namespace uses yet."""
    used = _ip("-4", "route", "show").stdout + _ip("-4", "addr", "show").stdout
    for _ in range(200):
        index = secrets.randbelow(SUBNET.num_addresses // 4 - 1) + 1
        net = ipaddress.ip_network(f"{SUBNET.network_address + 4 * index}/30")
        if str(net.network_address) not in used and str(net.network_address + 1) not in used:
            return net
    raise NetnsError(f"no free /30 in {SUBNET}")


@dataclass
class NetnsNode:
    name: str
    netns: str
    host: str  # the sshd's address, inside the namespace
    gateway: str  # the root namespace's end of the pair
    port: int
    veth_outer: str
    veth_inner: str
    subnet: str  # the pair's /30
    host_key: Path
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    partitioned: bool = False

    @property
    def known_hosts_line(self) -> str:
        return known_hosts_line(self.host, self.port, self.host_key.with_name(self.host_key.name + ".pub"))

    def pids(self) -> list[int]:
        """Every process running inside the namespace (sshd, its sessions, agents, ranks)."""
        r = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []

    def partition(self) -> None:
        """Cut the node off: both ends of the pair down. Nothing is closed, packets just vanish."""
        _ip("link", "set", self.veth_outer, "down")
        _ip("-n", self.netns, "link", "set", self.veth_inner, "down")
        self.partitioned = True

    def heal(self) -> None:
        _ip("-n", self.netns, "link", "set", self.veth_inner, "up")
        _ip("link", "set", self.veth_outer, "up")
        self.partitioned = False

    def stop(self) -> None:
        """Kill everything in the namespace, then remove the pair and the namespace. Idempotent."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 5
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        _ip("link", "del", self.veth_outer, check=False)  # removes its peer too
        _ip("netns", "del", self.netns, check=False)
        _ip("route", "del", "blackhole", self.subnet, check=False)


def _listening_in(pid: int, host: str, port: int) -> bool:
    """Whether ``pid``'s network namespace has host:port in LISTEN (read from /proc/PID/net/tcp)."""
    try:
        table = Path(f"/proc/{pid}/net/tcp").read_text()
    except OSError:
        return False
    want = f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"
    return any(
        len(cols) > 3 and cols[1] == want and cols[3] == "0A"
        for cols in (line.split() for line in table.splitlines()[1:])
    )


def start_netns_node(
    workdir: Path, client_key: Path, name: str = "nsnode", port: int = 22, client_alive_s: int = 1
) -> NetnsNode:
    """Start an sshd for ``client_key`` (root) inside a new namespace; see the module docstring."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    tag = secrets.token_hex(3)
    net = _free_subnet()
    gateway, host = str(net.network_address + 1), str(net.network_address + 2)
    node = NetnsNode(
        name=name,
        netns=f"mscon-{name}-{tag}",
        host=host,
        gateway=gateway,
        port=port,
        veth_outer=f"msh{tag}",
        veth_inner=f"msn{tag}",
        subnet=str(net),
        host_key=workdir / "ssh_host_ed25519_key",
        config=workdir / "sshd_config",
        log=workdir / "sshd.log",
    )
    try:
        # While the pair is down its connected route is gone: without this catch-all (a higher
        # metric than the connected route, so unused while the pair is up) packets for the node
        # would follow the default route off this machine. Dropped silently, like a pulled cable.
        _ip("route", "add", "blackhole", str(net), "metric", "4242")
        _ip("netns", "add", node.netns)
        _ip("link", "add", node.veth_outer, "type", "veth", "peer", "name", node.veth_inner)
        _ip("link", "set", node.veth_inner, "netns", node.netns)
        _ip("addr", "add", f"{gateway}/30", "dev", node.veth_outer)
        _ip("link", "set", node.veth_outer, "up")
        _ip("-n", node.netns, "addr", "add", f"{host}/30", "dev", node.veth_inner)
        _ip("-n", node.netns, "link", "set", node.veth_inner, "up")
        _ip("-n", node.netns, "link", "set", "lo", "up")

        for p in (node.host_key, node.host_key.with_name(node.host_key.name + ".pub")):
            p.unlink(missing_ok=True)
        _keygen(node.host_key, comment=name)
        authorized = workdir / "authorized_keys"
        authorized.write_text(client_key.with_name(client_key.name + ".pub").read_text())
        os.chmod(authorized, 0o600)
        config = _sshd_config(host, port, node.host_key, workdir / "sshd.pid", authorized)
        config += f"ClientAliveInterval {client_alive_s}\nClientAliveCountMax 2\n"
        node.config.write_text(config)
        _validate(node.config)
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        with open(node.log, "ab") as logf:
            node.proc = subprocess.Popen(
                [IP, "netns", "exec", node.netns, SSHD, "-D", "-e", "-f", str(node.config)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                close_fds=True,
                env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _listening_in(node.proc.pid, host, port):
            if node.proc.poll() is not None:
                raise NetnsError(
                    f"sshd in {node.netns} exited with {node.proc.returncode}: {_tail(node.log)}"
                )
            if time.monotonic() > deadline:
                raise NetnsError(
                    f"sshd in {node.netns} not listening after {START_TIMEOUT:g} s: {_tail(node.log)}"
                )
            time.sleep(0.02)
    except BaseException:
        node.stop()
        raise
    return node


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-5:]) or "(log empty)"
    except OSError:
        return "(no log)"
