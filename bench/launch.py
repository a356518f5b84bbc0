"""Launch latency: command start -> first training step on EVERY rank, mscon vs msrun.

Same script (trainer/train.py), same topology (NODES nodes x RANKS ranks on loopback), same steps:

* mscon: NODES real sshd servers on 127.0.0.2, 127.0.0.3, ... (tests/sshd_nodes.py), an inventory
  pointing at them, ``mscon run --no-tui -q INV -- trainer/train.py ARGS``; its stdout
  (``[node1 r0] epoch: 1 step: 1, loss is ...``) is read line by line and timestamped.
  Its figure INCLUDES what msrun does not do: SSH connect + auth, SFTP agent deploy (skipped when
  the content-hashed copy is already on the node), workdir archive + upload (same) + unpack on
  every node, and the agent start.
* msrun: NODES ``msrun --node_rank=i`` processes on this machine acting as the nodes; each rank's
  first step is found by polling its worker_<rank>.log in msrun's --log_dir. msrun starts a
  scheduler wherever --master_addr is a local address, so node_rank > 0 runs msrun's own entry
  point with that check answering "not local", as it does on a real second machine.

Each launcher runs --repeat times, alternating which goes first. Run from anywhere:

    .venv/bin/python bench/launch.py [--repeat 3] [--steps 5]

Needs root (sshd), and mscon, msrun and MindSpore in the running Python (else in .venv). Prints a
table: median and min of launcher start, scheduler start, "all ranks at first step", last step ->
exit and total wall, and the ratio mscon/msrun. The machine has 2 cores: each trial waits until
other jobs leave it idle, and a trial during which another job ran MindSpore or used CPU is flagged
and run again (--retry-shared).
The node-side run folders mscon leaves (agent/layout.py) are removed after each trial.

``--second`` measures the second launch of the same job on the same nodes, the one
``restart.keep_warm_s`` is for. Each mscon trial is then preceded by an untimed first launch of the
job with ``restart: {keep_warm_s: 600}``: as it ends, every node's agent leaves a kept standby
(agent/keeper.py: one spare per process of the node, joined to its own MindSpore cluster on the
scheduler port + 1). Once every worker's spare has joined (its ``<name>.joined`` marker in the node's
``~/.cache/mscon/warm/<node>/``) and the keeper serves (``keeper.sock``), the timed trial runs on the
same inventory and should adopt it: its stderr must say ``kept standby taken`` for every node and
``attempt 0 starts warm``. A trial where it does not is flagged COLD, printed with why, and left out
of the mscon column. The keeper the timed run leaves in turn (and any the bench leaves when it stops)
is ended after it (SIGTERM to the process running agent/keeper.py in that folder, the pid its
``keeper.pid`` names; its spares die with it), so msrun and the next trial find the machine as they
would without --second. msrun's trial is the same either way: msrun keeps nothing, so its second
launch is any launch (neither launcher uses the compile cache).

    .venv/bin/python bench/launch.py --second [--repeat 3]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from procstat import (  # bench/ is on sys.path when run as a script
    foreign_cpu,
    layout,
    ms_ports,
    node_runs,
    phase_medians,
    sshd_nodes,
    start_up,
    tool_env,
)

REPO = Path(__file__).resolve().parent.parent
ENV = tool_env("mscon", "msrun")  # the running Python's environment, else .venv's
PYTHON = ENV.python
SCRIPT = "trainer/train.py"
IDLE_WINDOW_S = 8.0  # a trial starts once other jobs left the machine idle this long
_RUN_SEQ = itertools.count(1)
NODE_RUNS = node_runs("root")  # where the sshd nodes' agents (user root) keep a run's files

# "epoch: 1 step: 1, loss is 2.30" (the trainer's LossMonitor-style line); any step counts as "first".
STEP_RE = re.compile(r"epoch:\s*\d+\s+step:\s*\d+,\s*loss is")
MSCON_LINE_RE = re.compile(r"^\[(?P<node>\S+) (?P<proc>\S+)\] (?P<text>.*)$")
MSRUN_REMOTE = (
    "import sys; from mindspore.parallel.cluster.process_entity import _api; "
    "_api._is_local_ip = lambda _ip: False; from mindspore.parallel.cluster.run import main; "
    "sys.argv[0] = 'msrun'; sys.exit(main())"
)
SCHED_MARK = "mscon-trainer scheduler"  # the trainer's first line on the scheduler, before `import mindspore`
# --second: the first launch keeps its standby longer than any wait for it (the bench ends it itself),
# and it must have joined on every node this long after the first launch exited.
KEEP_WARM_S = 600
KEPT_WAIT_S = 120.0
KEEPER_START_S = 30.0  # after mscon exits, its agents' keepers have started by then
KEEPER_SOCKET = "keeper.sock"  # agent/keeper.py SOCKET: there while the keeper serves
# The headless reporter's word on each node's kept standby, and on a warm attempt 0.
KEPT_RE = re.compile(
    r"^mscon: (?P<node>\S+): kept standby "
    r"(?:taken: |not taken \((?P<why>.*)\): attempt 0 starts cold$)"
)
WARM_MARK = "mscon: attempt 0 starts warm"


@dataclass
class Trial:
    launcher: str
    index: int
    world: int
    ok: bool = False
    first_step: dict[int, float] = field(default_factory=dict)  # rank -> s since command start
    launcher_up: float | None = None  # the launcher's own first line (its Python imports are done)
    first_output: float | None = None  # the scheduler's first line (the ranks are running)
    last_step: float | None = None  # the last step line of any rank
    wall: float = 0.0
    error: str = ""
    tail: list[str] = field(default_factory=list)
    foreign: int = 0  # peak count of other jobs' MindSpore processes during the trial
    foreign_cpu: float = 0.0  # CPU seconds other jobs used during the trial
    # mscon: where its start-up went, from its summary (the line it prints, and each milestone's seconds)
    phases_line: str = ""
    phases: list[tuple[str, float]] = field(default_factory=list)
    # --second: the trial should have started on the standby the first launch kept; cold says why
    # not (nodes that did not take it, or no warm attempt 0), "" when it did
    second: bool = False
    kept: dict[str, str] = field(default_factory=dict)  # node -> "" (taken) or why not, from stderr
    warm: bool = False  # stderr said "attempt 0 starts warm"
    cold: str = ""

    @property
    def shared(self) -> bool:
        return bool(self.foreign) or self.foreign_cpu > max(1.0, 0.05 * self.wall)

    @property
    def all_ranks(self) -> float | None:
        if len(self.first_step) < self.world:
            return None
        return max(self.first_step.values())

    @property
    def teardown(self) -> float | None:
        return None if self.last_step is None else self.wall - self.last_step

    def line(self) -> str:
        shared = ""
        if self.shared:
            shared = (
                f" [NOT ALONE: other jobs used {self.foreign_cpu:.1f} CPU-s, "
                f"up to {self.foreign} MindSpore processes]"
            )
        if not self.ok:
            return f"{self.launcher} #{self.index}: FAILED after {self.wall:.1f} s: {self.error}{shared}"
        per_rank = " ".join(f"r{r}={t:.2f}" for r, t in sorted(self.first_step.items()))
        standby = ""
        if self.second:
            standby = f" COLD! ({self.cold})" if self.cold else " [warm: kept standby taken on every node]"
        first = "-" if self.first_output is None else f"{self.first_output:.2f}"
        up = "-" if self.launcher_up is None else f"{self.launcher_up:.2f}"
        return (
            f"{self.launcher} #{self.index}: launcher up {up} s, scheduler up {first} s; "
            f"first step {per_rank}; all ranks {self.all_ranks:.2f} s; last step {self.last_step:.2f} s; "
            f"total wall {self.wall:.2f} s{standby}{shared}"
            + (f"\n  mscon's own breakdown, {self.phases_line}" if self.phases_line else "")
        )


def bench_env() -> dict[str, str]:
    """Both launchers' environment: the tools' python first on PATH (msrun finds `python` there)."""
    env = dict(os.environ)
    env["PATH"] = f"{ENV.bin}{os.pathsep}{env.get('PATH', os.defpath)}"
    env["GLOG_v"] = "3"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _kill_group(proc: subprocess.Popen[bytes], first: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
    """Stop a process started in its own session: ``first`` to its group, then KILL."""
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _pids_with_sched_port(ports: Iterable[int]) -> list[int]:
    """Processes whose environment carries MS_SCHED_PORT=one of ``ports``: the ranks of one trial
    (ports are unique), with its standby clusters' when it has the ports above its own."""
    needles = {f"MS_SCHED_PORT={port}".encode() for port in ports}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needles.intersection(f.read().split(b"\0")):
                    found.append(int(entry))
        except OSError:
            continue
    return found


class Contention(threading.Thread):
    """What other jobs did on this machine during a trial: MindSpore processes and CPU seconds.

    "Ours" is this benchmark's process tree: the sshd "nodes" are its children, so mscon's agents
    and ranks are inside it too, as are msrun and its workers.
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.lock = threading.Lock()
        # --second: the keepers of these nodes and their spares are ours, though outside our tree (an
        # agent starts its keeper in a session of its own and leaves: init adopts it), and the
        # adopted spares are the timed trial's ranks
        self.kept_nodes: tuple[str, ...] = ()
        self.own_ports: set[str] = set()
        self.peak = 0  # other jobs' MindSpore processes, at most at once
        self.cpu = 0.0  # CPU seconds used outside our tree since reset()
        self.ours: set[int] = set()
        self.prev: dict[int, float] = {}
        self.stop = threading.Event()

    def _foreign_cpu(self) -> dict[int, float]:
        return foreign_cpu(self.ours, keepers(self.kept_nodes) if self.kept_nodes else ())

    def reset(self, own_port: int) -> None:
        """Count from now, for a trial whose scheduler has ``own_port`` (and its standby clusters
        the two above it: agent/protocol.py standby_port)."""
        with self.lock:
            self.own_ports = {str(own_port + k) for k in range(3)}
            self.peak, self.cpu = 0, 0.0
            self.prev = self._foreign_cpu()

    def foreign(self) -> int:
        return sum(1 for p in ms_ports() if p not in self.own_ports)

    def sample(self) -> None:
        with self.lock:
            now = self._foreign_cpu()
            self.cpu += sum(max(0.0, c - self.prev.get(pid, 0.0)) for pid, c in now.items())
            self.prev = now
            self.peak = max(self.peak, self.foreign())

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.sample()


def end_bench(watch: Contention, cluster: Any, tmp: Path, keep: bool, kept_nodes: Iterable[str] = ()) -> None:
    """What every bench does last, also after Ctrl-C or a failure: stop watching the machine, end
    the keepers of ``kept_nodes`` (a kept standby outlives its run and its sshd node), stop the sshd
    nodes, and remove the scratch folder (or say where it was kept)."""
    watch.stop.set()
    if ended := end_keepers(kept_nodes):
        print(f"ended the kept standby of {', '.join(ended)}")
    if cluster is not None:
        cluster.stop()
    if keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def wait_idle(watch: Contention, max_wait_s: float) -> None:
    """Before a trial: wait (up to max_wait_s) until no other job runs MindSpore or uses much CPU."""
    deadline = time.monotonic() + max_wait_s
    said = False
    while True:
        watch.reset(0)
        time.sleep(IDLE_WINDOW_S)  # long enough to not mistake the gap between two runs of another job
        watch.sample()
        busy = watch.peak or watch.cpu > 0.1 * IDLE_WINDOW_S  # > 10% of a core
        if not busy or time.monotonic() > deadline:
            break
        if not said:
            print(
                f"  waiting for other jobs to finish ({watch.peak} MindSpore processes, "
                f"{watch.cpu / IDLE_WINDOW_S:.0%} CPU) ...",
                flush=True,
            )
            said = True
    if busy:
        print(f"  the machine is still busy after {max_wait_s:.0f} s; measuring anyway")


def _reap_leftovers(ports: Iterable[int], what: str, wait_s: float = 15.0) -> None:
    """Wait for a trial's ranks (MS_SCHED_PORT one of ``ports``) to be gone; kill (by pid) and
    report any that outlive their launcher."""
    ports = tuple(ports)
    deadline = time.monotonic() + wait_s
    while (pids := _pids_with_sched_port(ports)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pids:
        print(
            f"  WARNING: {what}: {len(pids)} process(es) still alive {wait_s:.0f} s after the launcher exited"
        )
        print(f"  ({pids}); killing them so the next trial starts clean", flush=True)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ---------------------------------------------------------------- kept standby (--second)


def kept_folder(node: str) -> Path:
    """Where the agent of sshd node ``node`` keeps the standby a run left for the next one
    (agent/layout.py: beside the runs of the node user, root, whose home the nodes share; one folder
    per node name). layout derives it from a run folder: any run id will do."""
    return Path(layout.kept_folder(str(NODE_RUNS / "any" / node), node))


def keepers(nodes: Iterable[str]) -> dict[int, str]:
    """The live keepers of ``nodes``: pid -> node. Found by their command line and working folder
    (the node's kept folder), not by keeper.pid: a keeper writes that only after starting its
    spares, and a killed one leaves it behind, its pid free for reuse."""
    folders = {str(kept_folder(node)): node for node in nodes}
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not any(arg.endswith(b"/keeper.py") for arg in argv[1:3]):
                continue
            node = folders.get(os.readlink(f"/proc/{entry}/cwd"))
        except OSError:
            continue
        if node is not None:
            found[int(entry)] = node
    return found


def end_keepers(nodes: Iterable[str], expect_s: float = 0.0, grace_s: float = 10.0) -> list[str]:
    """End the keepers of ``nodes`` and wait until they are gone: SIGTERM (a keeper kills its
    spares as it leaves; they would die with it anyway: parent-death signal), KILL after grace_s.
    The nodes that had one. A keeper left alone holds its spares for KEEP_WARM_S, and they would
    take CPU from msrun's trial and be adopted by (or dropped at a cost to) the next mscon one.
    ``expect_s``: a run that should have kept a standby just ended; its agents start their keepers
    as they leave, which can be after mscon exited: wait up to that long for every node's."""
    nodes = tuple(nodes)
    deadline = time.monotonic() + expect_s
    while len(set((found := keepers(nodes)).values())) < len(nodes) and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in found:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while keepers(nodes) and time.monotonic() < deadline:  # a zombie's cmdline is empty: gone
            time.sleep(0.1)
        if not keepers(nodes):
            break
    return sorted(set(found.values()))


def wait_kept(workers: dict[str, list[str]], timeout_s: float) -> str:
    """Wait until the standby kept on every node of ``workers`` (node -> its worker names) is ready:
    its keeper serves (keeper.sock) and each worker's spare has joined (its .joined marker; the
    scheduler's spare leaves none). "" once it is, else why not. A keeper may start after mscon
    exited (an agent leaves it as it goes, and mscon does not wait for that); one that was seen and
    is gone lost its standby: no use waiting on."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while True:
        missing = {}
        for node, names in workers.items():
            folder = kept_folder(node)
            wanted = [KEEPER_SOCKET, *(f"{name}.joined" for name in names)]
            if lacks := [f for f in wanted if not (folder / f).exists()]:
                missing[node] = lacks
        running = set(keepers(workers).values())
        seen |= running
        lost = sorted(seen - running)
        if not missing and not lost and running == set(workers):
            return ""
        if lost or time.monotonic() > deadline:
            if lost:
                why = f"the keeper of {', '.join(lost)} is gone"
            elif never := sorted(set(workers) - seen):
                why = f"no keeper started on {', '.join(never)} in {timeout_s:.0f} s"
            else:
                why = f"not ready after {timeout_s:.0f} s"
            detail = "; ".join(f"{node} lacks {', '.join(lacks)}" for node, lacks in missing.items())
            return f"the standby the first launch kept: {why} ({detail or 'every marker there'})"
        time.sleep(0.2)


def kept_logs(nodes: Iterable[str], lines: int = 5) -> list[str]:
    """The last lines of each node's keeper.err and spare logs, for a standby that did not come."""
    out = []
    for node in nodes:
        folder = kept_folder(node)
        for path in sorted(folder.glob("*.log")) + [folder / "keeper.err"]:
            try:
                tail = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            out += [f"--- {kept_folder(node) / path.name} ---", *tail]
    return out


# ---------------------------------------------------------------- mscon


def _wait_mscon(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """mscon's exit code, or None once it ran past ``timeout_s`` and was stopped."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc, first=signal.SIGINT)  # SIGINT: mscon stops the ranks on every node
        return None
    except KeyboardInterrupt:
        _kill_group(proc, first=signal.SIGINT)
        raise


def node_name(node: Any) -> str:
    """An sshd node's name in the inventory: the name its agent (and its kept folder) goes by."""
    return f"bench-{node.name}"


def node_workers(cluster: Any, ranks_per_node: int) -> dict[str, list[str]]:
    """Node name -> its worker processes' names: global ranks go node by node, in inventory order
    (console/engine/plan.py); the scheduler is the first node's, besides."""
    return {
        node_name(n): [f"r{i * ranks_per_node + k}" for k in range(ranks_per_node)]
        for i, n in enumerate(cluster.nodes)
    }


def write_inventory(
    path: Path, cluster: Any, ranks_per_node: int, sched_port: int, keep_warm_s: float = 0.0
) -> None:
    """The bench's inventory; ``keep_warm_s`` > 0: a run that ends by itself keeps a joined standby
    that long for the next run of the job (--second)."""
    nodes = "\n".join(
        f"  - {{host: {n.host}, name: {node_name(n)}, port: {n.port}, devices: {ranks_per_node}}}"
        for n in cluster.nodes
    )
    restart = f"restart: {{keep_warm_s: {keep_warm_s:g}}}\n" if keep_warm_s > 0 else ""
    path.write_text(
        f"""# written by bench/launch.py
name: bench-launch
device_target: CPU
defaults:
  user: root
  transport: ssh
  identity_file: {cluster.client_key}
  python: {PYTHON}
nodes:
{nodes}
scheduler: {{port: {sched_port}}}
job:
  workdir: {REPO}
  script: {SCRIPT}
  env: {{GLOG_v: "3"}}
ssh:
  known_hosts: {cluster.known_hosts}
stop: {{grace_s: 3}}
{restart}""",
        encoding="utf-8",
    )


def mscon_cmd(run_id: str, inv: Path, tmp: Path, train_args: list[str]) -> list[str]:
    return [
        str(ENV.bin / "mscon"),
        "run",
        "--no-tui",
        "-q",
        str(inv),
        "--logs-dir",
        str(tmp / layout.LOGS_DIR),
        "--run-id",
        run_id,
        "--json",
        str(tmp / f"{run_id}.json"),
        "--",
        SCRIPT,
        *train_args,
    ]


def first_launch(
    cluster: Any, ranks_per_node: int, train_args: list[str], tmp: Path, timeout_s: float, port: int
) -> tuple[str, str]:
    """--second: the untimed first launch of the job, which leaves a kept standby on every node as it
    ends. (its run id, "" or why it failed). Its node-side run folder stays until the trial's end:
    the kept spares started in its workdir."""
    run_id = f"bench-launch-{os.getpid()}-{next(_RUN_SEQ)}-first"
    inv = tmp / f"{run_id}.yaml"
    write_inventory(inv, cluster, ranks_per_node, port, keep_warm_s=KEEP_WARM_S)
    out_path = tmp / f"{run_id}.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            mscon_cmd(run_id, inv, tmp, train_args),
            cwd=tmp,
            env=bench_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        rc = _wait_mscon(proc, timeout_s)
    _reap_leftovers([port], "mscon's first launch")  # not port + 1: the kept standby's cluster
    if rc == 0:
        return run_id, ""
    tail = out_path.read_text(errors="replace").splitlines()[-20:]
    why = f"timed out after {timeout_s:.0f} s" if rc is None else f"exited with {rc}"
    return run_id, f"the untimed first launch {why}; its last lines:" + "".join(f"\n    {x}" for x in tail)


def run_second(
    index: int,
    cluster: Any,
    ranks_per_node: int,
    train_args: list[str],
    tmp: Path,
    timeout_s: float,
    port: int,
    watch: Contention,
) -> Trial:
    """--second: the first launch, a wait for the standby it kept, then the timed trial on it."""
    workers = node_workers(cluster, ranks_per_node)
    first_id = ""
    timed = False
    try:
        first_id, problem = first_launch(cluster, ranks_per_node, train_args, tmp, timeout_s, port)
        t = time.monotonic()
        if not problem and (problem := wait_kept(workers, KEPT_WAIT_S)):
            problem += "; its logs:" + "".join(f"\n    {x}" for x in kept_logs(workers))
        if problem:
            return Trial("mscon", index, len(cluster.nodes) * ranks_per_node, second=True, error=problem)
        took = time.monotonic() - t
        print(f"  (first launch done; every node's kept standby ready {took:.1f} s after it)", flush=True)
        watch.reset(port)  # the timed trial starts here: the first launch was ours, not another job's
        timed = True
        return run_mscon(index, cluster, ranks_per_node, train_args, tmp, timeout_s, port, KEEP_WARM_S)
    finally:
        if not timed:  # the first launch's standby (the timed run ends its own, and this one)
            end_keepers(workers, expect_s=KEEPER_START_S if first_id else 0.0)
        if first_id:
            shutil.rmtree(NODE_RUNS / first_id, ignore_errors=True)


def run_mscon(
    index: int,
    cluster: Any,
    ranks_per_node: int,
    train_args: list[str],
    tmp: Path,
    timeout_s: float,
    port: int,
    keep_warm_s: float = 0.0,
) -> Trial:
    """One timed mscon launch; ``keep_warm_s`` > 0 (--second): with the inventory of the first launch
    that kept a standby, which this one should adopt (and whose stderr is checked for it)."""
    world = len(cluster.nodes) * ranks_per_node
    run_id = f"bench-launch-{os.getpid()}-{next(_RUN_SEQ)}"
    inv = tmp / f"{run_id}.yaml"
    write_inventory(inv, cluster, ranks_per_node, port, keep_warm_s)
    cmd = mscon_cmd(run_id, inv, tmp, train_args)
    trial = Trial("mscon", index, world, second=keep_warm_s > 0)
    recent: collections.deque[str] = collections.deque(maxlen=40)
    err: collections.deque[str] = collections.deque(maxlen=40)
    lock = threading.Lock()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=tmp,
        env=bench_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )

    def read_out() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            now = time.monotonic() - t0
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            recent.append(line)
            m = MSCON_LINE_RE.match(line)
            if m is None:
                continue
            name, text = m.group("proc"), m.group("text")
            with lock:
                if name == "sched" and trial.first_output is None and SCHED_MARK in text:
                    trial.first_output = now
                elif name.startswith("r") and name[1:].isdigit() and STEP_RE.search(text):
                    trial.first_step.setdefault(int(name[1:]), now)
                    trial.last_step = now

    def read_err() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            if trial.launcher_up is None:  # "mscon: run ID: N ranks on ...": imports done, engine starting
                trial.launcher_up = time.monotonic() - t0
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            err.append(line)
            if m := KEPT_RE.match(line):
                trial.kept[m.group("node")] = m.group("why") or ""
            elif line.startswith(WARM_MARK):
                trial.warm = True

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    rc = _wait_mscon(proc, timeout_s)
    for t in readers:
        t.join(timeout=10)
    trial.wall = time.monotonic() - t0
    trial.tail = [*recent, "--- stderr ---", *err]
    if rc is None:
        trial.error = f"timed out after {timeout_s:.0f} s"
    elif rc != 0:
        trial.error = f"mscon exited with {rc}"
    elif trial.all_ranks is None:
        trial.error = f"only ranks {sorted(trial.first_step)} of {world} printed a step"
    else:
        trial.ok = True
    for _, line, took in start_up(tmp / f"{run_id}.json")[:1]:
        trial.phases_line, trial.phases = line, took
    if trial.second:
        names = [node_name(n) for n in cluster.nodes]
        cold = [f"{node}: no word on a kept standby" for node in names if node not in trial.kept]
        cold += [f"{node}: not taken ({why})" for node, why in trial.kept.items() if why]
        if not cold and not trial.warm:
            cold.append("no 'attempt 0 starts warm'")
        trial.cold = "; ".join(cold)
        # This run kept a standby in turn (unless stopped at the timeout: then it did not end by
        # itself): end it before the leftovers are counted (its spares sit on port + 1, as this
        # run's adopted ranks did)
        end_keepers(names, expect_s=0.0 if rc is None else KEEPER_START_S)
    # port + 1, port + 2: the standby clusters' (agent/protocol.py standby_port), the agents end them
    _reap_leftovers(range(port, port + 3), "mscon")
    # The "nodes" share this machine's home: drop the node-side run folder (logs + unpacked workdir),
    # which mscon keeps forever; the fetched copy under tmp goes with tmp.
    shutil.rmtree(NODE_RUNS / run_id, ignore_errors=True)
    return trial


# ---------------------------------------------------------------- msrun


def start_msrun_node(
    base: Path, node: int, nodes: int, ranks_per_node: int, port: int, train_args: list[str]
) -> tuple[subprocess.Popen[bytes], BinaryIO]:
    """Start msrun as node ``node`` would run it, logging under ``base/node<node>``; the caller
    closes the returned output file (``base/msrun-node<node>.out``) and stops the process."""
    log_dir = base / f"node{node}"
    log_dir.mkdir(parents=True)
    out = open(base / f"msrun-node{node}.out", "wb")  # noqa: SIM115 - the caller closes it
    # msrun starts a scheduler wherever --master_addr is a local address, i.e. in EVERY process
    # here (the second one then fails to bind and msrun exits 1). The other nodes run msrun as it
    # runs on a second machine: same entry point, but the master address is not local.
    launcher = [str(ENV.bin / "msrun")] if node == 0 else [str(PYTHON), "-c", MSRUN_REMOTE]
    cmd = [
        *launcher,
        f"--worker_num={nodes * ranks_per_node}",
        f"--local_worker_num={ranks_per_node}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        f"--node_rank={node}",
        f"--log_dir={log_dir}",
        "--join=True",
        SCRIPT,
        *train_args,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=bench_env(),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, out


def run_msrun(
    index: int, nodes: int, ranks_per_node: int, train_args: list[str], tmp: Path, timeout_s: float, port: int
) -> Trial:
    world = nodes * ranks_per_node
    base = Path(tempfile.mkdtemp(prefix=f"msrun-{index}-", dir=tmp))
    trial = Trial("msrun", index, world)
    procs: list[subprocess.Popen[bytes]] = []
    outs = []
    t0 = time.monotonic()
    for node in range(nodes):
        proc, out = start_msrun_node(base, node, nodes, ranks_per_node, port, train_args)
        procs.append(proc)
        outs.append(out)  # closed below
    # rank r of node n logs to <log_dir of n>/worker_<r>.log; the scheduler to node0/scheduler.log
    logs = {r: base / f"node{r // ranks_per_node}" / f"worker_{r}.log" for r in range(world)}
    offsets = dict.fromkeys(logs, 0)
    partial = dict.fromkeys(logs, b"")
    sched_log = base / "node0" / "scheduler.log"
    deadline = t0 + timeout_s
    timed_out = False
    while True:
        now = time.monotonic() - t0
        if trial.launcher_up is None and os.path.getsize(base / "msrun-node0.out") > 0:
            trial.launcher_up = now  # "Start scheduler process ...": msrun imported MindSpore
        if trial.first_output is None:
            try:
                if SCHED_MARK.encode() in sched_log.read_bytes():
                    trial.first_output = now
            except OSError:
                pass
        for rank, path in logs.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[rank])
                    data = partial[rank] + f.read()
                    offsets[rank] = f.tell()
            except OSError:
                continue
            lines = data.split(b"\n")
            partial[rank] = lines.pop()
            if any(STEP_RE.search(line.decode("utf-8", errors="replace")) for line in lines):
                trial.first_step.setdefault(rank, now)
                trial.last_step = now
        if all(p.poll() is not None for p in procs):
            break
        if time.monotonic() > deadline:
            timed_out = True
            for p in procs:
                _kill_group(p)
            break
        try:
            time.sleep(0.02)
        except KeyboardInterrupt:
            for p in procs:
                _kill_group(p)
            raise
    trial.wall = time.monotonic() - t0
    for out in outs:
        out.close()
    rcs = [p.wait() for p in procs]
    for node in range(nodes):
        text = (base / f"msrun-node{node}.out").read_text(errors="replace").splitlines()
        trial.tail += [f"--- msrun node_rank={node} (rc {rcs[node]}) ---", *text[-15:]]
    for path in logs.values():
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            text = ["(no log)"]
        trial.tail += [f"--- {path.relative_to(tmp)} ---", *text[-8:]]
    if timed_out:
        trial.error = f"timed out after {timeout_s:.0f} s"
    elif any(rcs):
        trial.error = f"msrun exit codes {rcs}"
    elif trial.all_ranks is None:
        trial.error = f"only ranks {sorted(trial.first_step)} of {world} logged a step"
    else:
        trial.ok = True
    _reap_leftovers([port], "msrun")
    return trial


# ---------------------------------------------------------------- report


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):7.2f} ({min(values):.2f})"


def _ratio(a: list[float], b: list[float]) -> str:
    if not a or not b:
        return "-"
    return f"{statistics.median(a) / statistics.median(b):.2f}x"


def report(trials: list[Trial], second: bool = False) -> None:
    # --second: a cold mscon trial measured a first launch again, not the second one asked for
    ok = {n: [t for t in trials if t.launcher == n and t.ok and not t.cold] for n in ("mscon", "msrun")}
    rows = [
        ("launcher's first line", lambda t: t.launcher_up),
        ("scheduler's first line", lambda t: t.first_output),
        ("all ranks at first step", lambda t: t.all_ranks),
        ("last step -> exit", lambda t: t.teardown),
        ("total wall", lambda t: t.wall),
    ]
    print()
    if second:
        print("mscon: the 2nd launch of the job on the same nodes, on the standby the 1st one kept")
    mscon = "mscon 2nd, kept standby" if second else "mscon median (min)"
    head = ("seconds from command start", mscon, "msrun median (min)", "mscon/msrun")
    width = max(22, len(mscon) + 2)
    print(f"{head[0]:<28}{head[1]:>{width}}{head[2]:>22}{head[3]:>14}")
    if second:
        print(f"{'':<28}{'median (min)':>{width}}")
    for label, get in rows:
        a = [v for t in ok["mscon"] if (v := get(t)) is not None]
        b = [v for t in ok["msrun"] if (v := get(t)) is not None]
        print(f"{label:<28}{_stats(a):>{width}}{_stats(b):>22}{_ratio(a, b):>14}")
    timed = [t.phases for t in ok["mscon"] if t.phases]
    if timed:
        print(f"mscon's start-up by milestone (median s, each after the one before): {phase_medians(timed)}")
    shared = [f"{t.launcher} #{t.index}" for t in trials if t.shared]
    if shared:
        print(f"WARNING: other jobs used the machine during {', '.join(shared)}: those timings are inflated")
    failed = [t for t in trials if not t.ok]
    counts = ", ".join(f"{name} {len(v)}" for name, v in ok.items())
    print(f"successful trials: {counts}; failed: {len(failed)}")
    if second:
        tried = [t for t in trials if t.launcher == "mscon" and t.ok]
        cold = [f"#{t.index}" for t in tried if t.cold]
        print(
            f"mscon trials warm (kept standby taken on every node): {len(tried) - len(cold)} of {len(tried)}"
            + (f"; COLD, left out of the table: {', '.join(cold)}" if cold else "")
        )
    print(
        "note: mscon's times include SSH connect + auth, the agent deploy and the workdir sync\n"
        "(archive, upload unless already cached on the node, unpack) and the agent start; msrun's\n"
        "do not (its nodes are local processes reading the repo in place). Detection latency:\n"
        "mscon lines pass through the agent's log tail (flushed every 0.1 s); msrun logs are\n"
        "polled every 0.02 s."
        + (
            "\n--second: mscon's untimed first launch and the wait for its kept standby come before\n"
            "the command start; msrun's trial is an ordinary launch (it keeps nothing between runs).\n"
            "A warm mscon run has no scheduler's first line: its scheduler is the kept standby's,\n"
            "serving in init() since the wait, and never runs the trainer."
            if second
            else ""
        )
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (e.g. `timeout`): clean up like Ctrl-C (sshd nodes, temp files)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="trials per launcher")
    p.add_argument("--nodes", type=int, default=2, help="nodes (sshd servers / msrun processes)")
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="--steps-per-epoch for the trainer (1 epoch)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per trial before it is stopped")
    p.add_argument("--only", choices=("mscon", "msrun"), help="run one launcher only")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed `import mindspore` first")
    p.add_argument(
        "--max-wait-idle",
        type=float,
        default=600.0,
        help="before each trial, wait up to this long for other jobs to leave the machine idle",
    )
    p.add_argument(
        "--retry-shared",
        type=int,
        default=2,
        help="run a trial again (up to this many times) when another job used the machine during it",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, inventories)")
    p.add_argument(
        "--second",
        action="store_true",
        help="time mscon's 2nd launch of the job: after an untimed 1st one that keeps a standby "
        f"(restart.keep_warm_s {KEEP_WARM_S}) for it to adopt",
    )
    a = p.parse_args(argv)
    if a.nodes * a.ranks_per_node > 4:
        p.error("at most 4 MindSpore ranks at once on this machine")
    if a.repeat < 1:
        p.error("--repeat must be >= 1")
    if problem := ENV.problem("mscon", "msrun"):
        p.error(problem)
    if a.second and a.only == "msrun":
        p.error("--second is about mscon's launch: drop --only msrun")
    train_args = ["--parallel-mode", "data_parallel", "--epochs", "1", "--steps-per-epoch", str(a.steps)]
    world = a.nodes * a.ranks_per_node
    print(f"launch benchmark: {a.nodes} nodes x {a.ranks_per_node} ranks (world {world}) on loopback")
    print(f"script: {SCRIPT} {' '.join(train_args)}; {a.repeat} trial(s) per launcher, order alternating")
    if a.second:
        print("--second: each mscon trial is the job's 2nd launch, on the standby an untimed 1st one kept")
    if not a.no_warmup:
        t = time.monotonic()
        warm = [str(PYTHON), "-c", "import mindspore"]
        subprocess.run(warm, env=bench_env(), check=True, capture_output=True)
        print(f"warm-up (untimed): import mindspore took {time.monotonic() - t:.1f} s")

    tmp = Path(tempfile.mkdtemp(prefix="mscon-bench-launch-"))
    cluster = None
    trials: list[Trial] = []
    kept_nodes: list[str] = []  # the nodes' names: their kept standbys (--second) end with the bench
    watch = Contention()
    watch.start()
    try:
        if a.only != "msrun":
            cluster = sshd_nodes().start_sshd_cluster(tmp / "sshd", n=a.nodes)
            kept_nodes[:] = [node_name(n) for n in cluster.nodes]
            if a.second:
                watch.kept_nodes = tuple(kept_nodes)
            where = ", ".join(f"{n.host}:{n.port}" for n in cluster.nodes)
            print(f"sshd nodes: {where}")
        launchers = ["mscon", "msrun"] if a.only is None else [a.only]
        for i in range(1, a.repeat + 1):
            order = launchers if i % 2 else launchers[::-1]
            for name in order:
                for attempt in range(a.retry_shared + 1):
                    wait_idle(watch, a.max_wait_idle)
                    port = sshd_nodes().find_free_port(["127.0.0.1", "127.0.0.2"])
                    watch.reset(port)
                    if name == "mscon" and a.second:
                        trial = run_second(
                            i, cluster, a.ranks_per_node, train_args, tmp, a.timeout, port, watch
                        )
                    elif name == "mscon":
                        trial = run_mscon(i, cluster, a.ranks_per_node, train_args, tmp, a.timeout, port)
                    else:
                        trial = run_msrun(i, a.nodes, a.ranks_per_node, train_args, tmp, a.timeout, port)
                    watch.sample()
                    trial.foreign, trial.foreign_cpu = watch.peak, watch.cpu
                    print(trial.line(), flush=True)
                    if not trial.shared or attempt == a.retry_shared:
                        break
                    print("  (discarded: the machine was shared; trying again)", flush=True)
                trials.append(trial)
                if not trial.ok:
                    print("  last output:")
                    for line in trial.tail[-60:]:
                        print(f"    {line}")
    except KeyboardInterrupt:
        print("interrupted; partial results:")
    finally:
        end_bench(watch, cluster, tmp, a.keep, kept_nodes)
    report(trials, a.second)
    return 0 if trials and all(t.ok and not t.cold for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
