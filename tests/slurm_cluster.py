"""A real, throw-away Slurm cluster for tests: munged + slurmctld + slurmd on this machine.

Test helper (stdlib only, Linux, root). ``start_slurm_cluster(workdir)`` writes a munge key and a
``slurm.conf`` into ``workdir`` (one node: this machine's hostname, one partition), starts
``munged`` on a socket of its own and ``slurmctld`` / ``slurmd`` in the foreground with every
state file, spool folder, pid file and log under ``workdir``, and waits until the nodes are idle.
Clients (``salloc``, ``srun``, ``scontrol``, ``squeue``) find it through ``SLURM_CONF``:
``cluster.env()`` is ``os.environ`` plus that. ``stop()`` cancels every job, then ends the
daemons (and only them: they are this helper's own children). Nothing outside ``workdir`` is
written; the machine's ``/etc/slurm`` and ``/etc/munge`` are not used.

``start_slurm_cluster(workdir, netns_nodes=N)`` adds N nodes, each a slurmd in a network and UTS
namespace of its own (its own hostname, ``<host>-n1``...), joined to this machine by a veth pair
with addresses from a private /30 of 10.214.0.0/16 (they exist only on the pairs). Slurm then
reaches every node, this machine's included, by those addresses (the namespaces cannot reach
this machine's loopback, where its hostname resolves); ``cluster.console_address`` is where the
nodes reach this machine. ``stop()`` also kills whatever runs in the namespaces and removes them.

``slurm_unavailable_reason()`` / ``netns_unavailable_reason()`` say why not here, so tests skip
with that reason. Install with ``apt-get install -y slurm-wlm munge`` (Debian 12: Slurm 22.05).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sshd_nodes import find_free_port

__all__ = [
    "NetnsNode",
    "SlurmCluster",
    "SlurmError",
    "netns_unavailable_reason",
    "slurm_unavailable_reason",
    "start_slurm_cluster",
]

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "/sbin/ip"
START_TIMEOUT = 30.0
_CLIENTS = ("salloc", "srun", "scontrol", "squeue", "scancel", "sbatch", "sinfo")


class SlurmError(RuntimeError):
    pass


def slurm_unavailable_reason() -> str | None:
    """None when a cluster can be started here, else why not (for ``pytest.skip``)."""
    if os.geteuid() != 0:
        return "the Slurm test cluster runs its daemons as root (slurmd launches as any user)"
    missing = [p for p in (MUNGED, SLURMCTLD, SLURMD) if not os.access(p, os.X_OK)]
    missing += [c for c in _CLIENTS if shutil.which(c) is None]
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise SlurmError(f"ip {' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    return r


def netns_unavailable_reason() -> str | None:
    """None when a node can have network and UTS namespaces of its own here, else why not."""
    if not os.access(IP, os.X_OK) or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "no ip(8), unshare(1) or nsenter(1) here (iproute2, util-linux)"
    probe = f"msl-probe-{secrets.token_hex(2)}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {(r.stderr or r.stdout).strip()}"
    try:
        u = subprocess.run(
            [IP, "netns", "exec", probe, "unshare", "--uts", "hostname", "probe"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if u.returncode != 0:
            return f"cannot give a namespace its own hostname: {u.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


@dataclass
class NetnsNode:
    """A node's network namespace and its veth pair (the host end keeps ``host_ip``)."""

    name: str
    ns: str
    host_if: str
    host_ip: str
    node_ip: str

    @classmethod
    def create(cls, name: str, index: int, octet: int) -> NetnsNode:
        tag, base = secrets.token_hex(2), 4 * index
        node = cls(
            name=name,
            ns=f"msl-{tag}-{index}",
            host_if=f"msl{tag}h{index}",
            host_ip=f"10.214.{octet}.{base + 1}",
            node_ip=f"10.214.{octet}.{base + 2}",
        )
        inner = f"msl{tag}n{index}"
        _ip("netns", "add", node.ns)
        try:
            _ip("link", "add", node.host_if, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", node.ns)
            _ip("addr", "add", f"{node.host_ip}/30", "dev", node.host_if)
            _ip("link", "set", node.host_if, "up")
            _ip("-n", node.ns, "addr", "add", f"{node.node_ip}/30", "dev", inner)
            _ip("-n", node.ns, "link", "set", inner, "up")
            _ip("-n", node.ns, "link", "set", "lo", "up")
        except BaseException:
            node.remove()
            raise
        return node

    def remove(self) -> None:
        for pid in _ip("netns", "pids", self.ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)  # what Slurm left in the namespace: ours alone
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.ns, check=False)


@dataclass
class SlurmCluster:
    workdir: Path
    conf: Path
    node: str  # the first node's name: this machine's hostname
    cpus: int
    procs: dict[str, subprocess.Popen[bytes]]
    netns: list[NetnsNode] = field(default_factory=list)  # further nodes, one namespace each
    console_address: str | None = None  # where nodes in namespaces reach this machine

    @property
    def nodes(self) -> list[str]:
        return [self.node, *(n.name for n in self.netns)]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for Slurm clients of this cluster (no allocation variables)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def run(
        self, *argv: str, timeout: float = 30, cwd: Path | None = None, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env(**extra), capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL, cwd=cwd,
        )  # fmt: skip

    def steps(self) -> list[str]:
        """Every job step Slurm knows of (``squeue -s``): 'JOBID.STEPID NAME' lines."""
        r = self.run("squeue", "-s", "-h", "-o", "%i %j")
        if r.returncode != 0:
            raise SlurmError(f"squeue -s: {r.stderr.strip()}")
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]

    def jobs(self) -> list[str]:
        r = self.run("squeue", "-h", "-o", "%i %j %T")
        if r.returncode != 0:
            raise SlurmError(f"squeue: {r.stderr.strip()}")
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user=root", timeout=10)
        for name in [*(n.name for n in self.netns), "slurmd", "slurmctld", "munged"]:
            proc = self.procs.pop(name, None)
            if proc is not None:
                _terminate(proc)
        for ns in self.netns:
            ns.remove()
        self.netns = []

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _free_ports() -> tuple[int, int]:
    """slurmctld's and slurmd's: below the ephemeral range, where no other test's outgoing
    connection takes one between this choice and the daemon's bind (sshd_nodes.find_free_port)."""
    port = find_free_port(["127.0.0.1"])
    return port, port + 1


def _conf(
    workdir: Path, node: str, cpus: int, munge_socket: Path, ports: tuple[int, int], netns: list[NetnsNode]
) -> str:
    w = workdir
    # Each test cluster numbers jobs from its own random start: a job id (and a run id made from
    # it, as in the sbatch example) is not reused by the next cluster on this machine.
    first_job_id = 1000 + secrets.randbelow(10**7)
    addr = netns[0].host_ip if netns else None
    ctld = f"{node}({addr})" if addr else node
    lines = [f"NodeName={node}" + (f" NodeAddr={addr}" if addr else "")]
    lines += [f"NodeName={n.name} NodeAddr={n.node_ip} NodeHostname={n.name}" for n in netns]
    node_lines = "\n".join(f"{line} CPUs={cpus} RealMemory=1024 State=UNKNOWN" for line in lines)
    all_nodes = ",".join([node, *(n.name for n in netns)])
    return f"""\
ClusterName=mscontest
FirstJobId={first_job_id}
SlurmctldHost={ctld}
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool-%n
SlurmctldPidFile={w}/slurmctld.pid
SlurmdPidFile={w}/slurmd-%n.pid
SlurmctldLogFile={w}/slurmctld.log
SlurmdLogFile={w}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
KillWait=5
MessageTimeout=10
{node_lines}
PartitionName=debug Nodes={all_nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _wait(pred: Callable[[], bool], timeout: float, what: str, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise SlurmError(f"{what} not ready after {timeout:g} s; logs:\n{log()}")


def start_slurm_cluster(workdir: Path, netns_nodes: int = 0) -> SlurmCluster:
    """Start munged, slurmctld and this machine's slurmd, plus ``netns_nodes`` nodes in
    namespaces of their own; ``SlurmError`` (with logs) if any fails."""
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)  # slurmd's spool and munge's socket folder must not be world-writable
    for sub in ("state", "munge"):
        (workdir / sub).mkdir(exist_ok=True)
    os.chmod(workdir / "munge", 0o755)
    key = workdir / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    munge_socket = workdir / "munge" / "munge.socket"
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    conf = workdir / "slurm.conf"
    cluster = SlurmCluster(workdir=workdir, conf=conf, node=node, cpus=cpus, procs={})

    def logs() -> str:
        names = ("munged", "slurmctld", *(f"slurmd-{d}" for d in cluster.nodes))
        return "\n".join(f"--- {n}\n{cluster.log_tail(n)}" for n in names)

    try:
        octet = secrets.randbelow(250) + 1
        for i in range(netns_nodes):
            cluster.netns.append(NetnsNode.create(f"{node}-n{i + 1}", i, octet))
        if cluster.netns:
            cluster.console_address = cluster.netns[0].host_ip
            for ns in cluster.netns[1:]:  # every pair's host end is this machine: one address for all
                _ip("-n", ns.ns, "route", "add", f"{cluster.console_address}/32", "via", ns.host_ip)
        for d in cluster.nodes:
            (workdir / f"spool-{d}").mkdir(exist_ok=True)
        conf.write_text(_conf(workdir, node, cpus, munge_socket, _free_ports(), cluster.netns))
        env = cluster.env()
        cluster.procs["munged"] = subprocess.Popen(
            [MUNGED, "-F", "-f", f"--socket={munge_socket}", f"--key-file={key}",
             f"--pid-file={workdir}/munge/munged.pid", f"--log-file={workdir}/munged.log",
             f"--seed-file={workdir}/munge/munged.seed"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(workdir / "munged.err", "wb"),
        )  # fmt: skip
        _wait(munge_socket.exists, START_TIMEOUT, "munged", logs)
        for name, exe in (("slurmctld", SLURMCTLD), ("slurmd", SLURMD)):
            argv = [exe, "-D", "-f", str(conf)] + (["-i"] if name == "slurmctld" else [])
            cluster.procs[name] = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=open(workdir / f"{name}.err", "wb"), start_new_session=True,
            )  # fmt: skip
        for ns in cluster.netns:
            # slurmd takes its node name from the hostname: its own, in its own UTS namespace.
            cluster.procs[ns.name] = subprocess.Popen(
                # nsenter, not `ip netns exec`: that remounts /sys, without the cgroup tree slurmd needs.
                ["nsenter", f"--net=/run/netns/{ns.ns}", "unshare", "--uts", "/bin/sh", "-c",
                 'hostname "$0" && exec "$1" -D -f "$2"', ns.name, SLURMD, str(conf)],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=open(workdir / f"{ns.name}.err", "wb"), start_new_session=True,
            )  # fmt: skip

        def idle() -> bool:
            for name, proc in cluster.procs.items():
                if proc.poll() is not None:
                    raise SlurmError(f"{name} exited ({proc.returncode}):\n{logs()}")
            r = cluster.run("sinfo", "-h", "-N", "-o", "%T", timeout=10)
            states = r.stdout.split()
            return (
                r.returncode == 0 and len(states) == len(cluster.nodes) and set(states) <= {"idle", "mixed"}
            )

        _wait(idle, START_TIMEOUT, "slurmd", logs)
    except BaseException:
        cluster.stop()
        raise
    return cluster
