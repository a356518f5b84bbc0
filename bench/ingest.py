"""Console ingest rate: log lines per second mscon takes from fast fake ranks and prints, headless.

For each rank count N: an inventory with N ranks of ``bench/fake_rank.py --rate 0 --steps S
--lines-per-step K`` (no MindSpore; each step prints one loss line and K filler lines as fast as it
can), run ``mscon run --no-tui -q INV`` and read its stdout through a pipe in big chunks, counting
lines and bytes as they arrive. Afterwards every received line is checked against what the ranks
printed: per-rank counts, and the filler lines' (step, line) order, so loss, duplication or
reordering within a rank shows up.

Local (default): one node, transport local (the agent is a subprocess of the console).
``--ssh``: the same over NODES real sshd servers on 127.0.0.2... (tests/sshd_nodes.py), ranks
split evenly over them.

    .venv/bin/python bench/ingest.py [--ranks 8 64] [--lines 400000] [--lines-per-step 9] [--ssh]

Numbers: lines and MB of console stdout (prefix ``[node rN] `` included), over the total wall
(command start to exit: includes the console's start-up, agent start, rank start and teardown) and
over the streaming window (first to last rank line received). "ranks ran" is the slowest rank's
own run time from mscon's --json summary: if it is much shorter than the streaming window, the
console, not the ranks, set the pace. CPU: seconds used by the console process and by the
agent(s), sampled from /proc every 0.1 s. Runs wait for other jobs to leave the machine idle and are
re-run when another job used it meanwhile (--retry-shared). Each run's node-side folder
(agent/layout.py: every rank's full log) is removed afterwards. mscon comes from the running
Python's environment, else from .venv.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procstat import (  # bench/ is on sys.path when run as a script
    foreign_cpu,
    layout,
    ms_ports,
    node_runs,
    sshd_nodes,
    tool_env,
)

REPO = Path(__file__).resolve().parent.parent
ENV = tool_env("mscon")  # the running Python's environment, else .venv's
PYTHON = ENV.python
SCRIPT = "bench/fake_rank.py"
CLK_TCK = os.sysconf("SC_CLK_TCK")
DEV = False  # --dev: run the console from the working tree (PYTHONPATH=.dev), not the install
IDLE_WINDOW_S = 8.0  # a trial starts once other jobs left the machine idle this long

LINE_RE = re.compile(rb"^\[(?P<node>[^ \]]+) (?P<proc>[^ \]]+)\] (?P<text>.*)$")
FILLER_RE = re.compile(rb"^rank (\d+) step (\d+) line (\d+) x+$")
LOSS_RE = re.compile(rb"^epoch: 1 step: (\d+), loss is [0-9.]+$")


# ---------------------------------------------------------------- CPU sampling


def _cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(rest[11]) + int(rest[12])) / CLK_TCK  # utime + stime


def _agent_pids(node_names: list[str]) -> list[int]:
    """Agents on this machine (node names travel on the agent's stdin, so every agent counts: run the
    benchmark alone)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"mscon_agent" in cmd:
            found.append(int(entry))
    return found


class Others:
    """CPU seconds used outside this benchmark's process tree (the sshd nodes are its children, so
    every agent and rank of ours is inside it): another job competing for the 2 cores."""

    def __init__(self) -> None:
        self.ours: set[int] = set()
        self.prev = self._cpu()
        self.cpu = 0.0

    def _cpu(self) -> dict[int, float]:
        return foreign_cpu(self.ours)

    def sample(self) -> float:
        now = self._cpu()
        self.cpu += sum(max(0.0, c - self.prev.get(pid, 0.0)) for pid, c in now.items())
        self.prev = now
        return self.cpu


def wait_idle(max_wait_s: float) -> None:
    """Before a run: wait (up to max_wait_s) until other jobs leave the machine (nearly) idle."""
    deadline = time.monotonic() + max_wait_s
    said = False
    while True:
        others = Others()
        time.sleep(IDLE_WINDOW_S)  # long enough to not mistake the gap between two runs of another job
        ranks, cpu = len(ms_ports()), others.sample()
        busy = ranks or cpu > 0.1 * IDLE_WINDOW_S  # > 10% of a core
        if not busy or time.monotonic() > deadline:
            break
        if not said:
            print(
                f"  waiting for other jobs to finish ({ranks} rank processes, "
                f"{cpu / IDLE_WINDOW_S:.0%} CPU) ..."
            )
            said = True
    if busy:
        print(f"  the machine is still busy after {max_wait_s:.0f} s; measuring anyway")


class CpuSampler(threading.Thread):
    """Last seen CPU seconds of the console and of its agents (sampled, so slightly low), and what
    other jobs used meanwhile."""

    def __init__(self, console_pid: int, node_names: list[str], own_port: int) -> None:
        super().__init__(daemon=True)
        self.console_pid = console_pid
        self.node_names = node_names
        self.own_port = str(own_port)
        self.foreign = 0  # peak count of other jobs' rank processes
        self.others = Others()
        self.console = 0.0
        self.agents: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        ticks = 0
        while not self.done.is_set():
            if ticks % 10 == 0:
                self.foreign = max(self.foreign, sum(1 for p in ms_ports() if p != self.own_port))
                self.others.sample()
            ticks += 1
            if (c := _cpu_s(self.console_pid)) is not None:
                self.console = c
            if len(self.agents) < len(self.node_names):
                for pid in _agent_pids(self.node_names):
                    self.agents.setdefault(pid, 0.0)
            for pid in self.agents:
                if (c := _cpu_s(pid)) is not None:
                    self.agents[pid] = c
            self.done.wait(0.1)
        self.others.sample()


# ---------------------------------------------------------------- one run


@dataclass
class Result:
    label: str
    ranks: int
    expected: int  # rank-output lines expected on stdout (scheduler included)
    lines: int = 0  # lines on stdout
    nbytes: int = 0
    wall: float = 0.0
    first: float | None = None
    last: float | None = None
    rc: int | None = None
    ranks_ran: float | None = None
    console_cpu: float = 0.0
    agent_cpu: float = 0.0
    foreign: int = 0
    foreign_cpu: float = 0.0
    problems: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)

    @property
    def shared(self) -> bool:
        return bool(self.foreign) or self.foreign_cpu > max(0.5, 0.05 * self.wall)

    @property
    def stream(self) -> float:
        return (self.last - self.first) if self.first is not None and self.last is not None else 0.0

    def report(self) -> str:
        mb = self.nbytes / 1e6
        stream = self.stream
        rate_s = f"{self.lines / stream:,.0f} lines/s, {mb / stream:.1f} MB/s" if stream > 0 else "-"
        ran = "-" if self.ranks_ran is None else f"{self.ranks_ran:.1f} s"
        missing = self.expected - self.lines
        verdict = "all lines arrived, in order" if not self.problems else "; ".join(self.problems[:8])
        return "\n".join(
            [
                f"{self.label}: {self.lines:,} lines ({mb:.1f} MB) of {self.expected:,} expected"
                f"{f', {missing:,} MISSING' if missing > 0 else ''}"
                f"{f', {-missing:,} EXTRA' if missing < 0 else ''}"
                f"; mscon exit code {self.rc}",
                f"  total wall {self.wall:.2f} s: {self.lines / self.wall:,.0f} lines/s, "
                f"{mb / self.wall:.1f} MB/s",
                f"  streaming {stream:.2f} s (first {self.first or 0:.2f} s -> last {self.last or 0:.2f} s): "
                f"{rate_s}",
                f"  slowest rank ran {ran}; CPU: console {self.console_cpu:.1f} s, "
                f"agent(s) {self.agent_cpu:.1f} s",
                f"  check: {verdict}",
            ]
            + (
                [
                    f"  NOT ALONE: other jobs used {self.foreign_cpu:.1f} CPU-s meanwhile "
                    f"(up to {self.foreign} rank processes)"
                ]
                if self.shared
                else []
            )
        )


def write_inventory(path: Path, ranks: int, rank_args: list[str], sched_port: int, cluster: Any) -> None:
    args = ", ".join(json.dumps(a) for a in rank_args)
    if cluster is None:
        head = f"defaults: {{python: {PYTHON}}}\nnodes:\n"
        head += f"  - {{host: localhost, name: bench-local, transport: local, devices: {ranks}}}\n"
        ssh = ""
    else:
        nodes = cluster.nodes
        per = [ranks // len(nodes) + (1 if i < ranks % len(nodes) else 0) for i in range(len(nodes))]
        head = (
            f"defaults: {{user: root, transport: ssh, python: {PYTHON}, "
            f"identity_file: {cluster.client_key}}}\n"
            "nodes:\n"
            + "".join(
                f"  - {{host: {n.host}, name: bench-{n.name}, port: {n.port}, devices: {k}}}\n"
                for n, k in zip(nodes, per, strict=True)
            )
        )
        ssh = f"ssh: {{known_hosts: {cluster.known_hosts}}}\n"
    path.write_text(
        "# written by bench/ingest.py\nname: bench-ingest\ndevice_target: CPU\n"
        + head
        + f"scheduler: {{port: {sched_port}}}\n"
        + f"job: {{workdir: {REPO}, script: {SCRIPT}, args: [{args}]}}\n"
        + ssh
        + "stop: {grace_s: 3}\n",
        encoding="utf-8",
    )


def run_once(
    label: str, ranks: int, steps: int, per_step: int, tmp: Path, cluster: Any, timeout_s: float
) -> Result:
    rank_args = ["--rate", "0", "--steps", str(steps), "--lines-per-step", str(per_step)]
    per_rank = steps * (1 + per_step) + 2  # "starting", the steps, "training finished"
    res = Result(label, ranks, expected=ranks * per_rank + 1)  # + the fake scheduler's one line
    host = "127.0.0.2" if cluster is not None else "127.0.0.1"
    port = sshd_nodes().find_free_port([host])
    run_dir = Path(tempfile.mkdtemp(prefix=re.sub(r"[^A-Za-z0-9]+", "-", label) + "-", dir=tmp))
    inv = run_dir / "inventory.yaml"
    write_inventory(inv, ranks, rank_args, port, cluster)
    summary = run_dir / "summary.json"
    capture = run_dir / "stdout.txt"
    if DEV:  # the working tree's source (.dev links to it), not the installed package
        cmd = [str(PYTHON), "-m", "mscon.console.cli", "run", "--no-tui", "-q", str(inv)]
    else:
        cmd = [str(ENV.bin / "mscon"), "run", "--no-tui", "-q", str(inv)]
    run_id = f"bench-ingest-{run_dir.name}"
    cmd += ["--json", str(summary), "--logs-dir", str(run_dir / layout.LOGS_DIR), "--run-id", run_id]
    env = dict(os.environ, PATH=f"{ENV.bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}")
    if DEV:
        env["PYTHONPATH"] = str(REPO / ".dev")
    with open(run_dir / "stderr.txt", "wb") as err, open(capture, "wb") as cap:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=run_dir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
        )
        names = [f"bench-{n.name}" for n in cluster.nodes] if cluster is not None else ["bench-local"]
        sampler = CpuSampler(proc.pid, names, port)
        sampler.start()
        timer = threading.Timer(timeout_s, proc.terminate)  # SIGTERM: mscon stops the run in order
        timer.start()
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        lines = nbytes = 0
        try:
            while chunk := os.read(fd, 1 << 20):
                now = time.monotonic() - t0
                if res.first is None:
                    res.first = now
                res.last = now
                lines += chunk.count(b"\n")
                nbytes += len(chunk)
                cap.write(chunk)
        except KeyboardInterrupt:
            timer.cancel()
            proc.terminate()  # mscon stops its ranks on every node
            proc.wait(60)
            raise
        res.rc = proc.wait()
        res.wall = time.monotonic() - t0
        timer.cancel()
        sampler.done.set()
        sampler.join()
    res.lines, res.nbytes = lines, nbytes
    res.console_cpu = sampler.console
    res.foreign, res.foreign_cpu = sampler.foreign, sampler.others.cpu
    res.agent_cpu = sum(sampler.agents.values())
    if res.rc != 0:
        res.problems.append(f"mscon exited with {res.rc}")
    try:
        data = json.loads(summary.read_text())
        walls = [r["wall_s"] for r in data.get("ranks", []) if r.get("rank", -1) >= 0 and r.get("wall_s")]
        res.ranks_ran = max(walls) if walls else None
    except (OSError, ValueError):
        res.problems.append("no --json summary")
    res.problems += verify(capture, ranks, steps, per_step)
    if res.problems:
        res.tail = capture.read_bytes()[-2000:].decode(errors="replace").splitlines()[-8:]
        err_lines = (run_dir / "stderr.txt").read_text(errors="replace").splitlines()
        res.tail += ["--- stderr ---", *err_lines[-25:]]
    shutil.rmtree(run_dir, ignore_errors=True)
    # The nodes (local or loopback sshd) share this machine's home: drop the node-side copy of the run
    # (every rank's full log, tens of MB here), which mscon never prunes.
    shutil.rmtree(node_runs(None if cluster is None else "root") / run_id, ignore_errors=True)
    return res


def verify(capture: Path, ranks: int, steps: int, per_step: int) -> list[str]:
    """What differs between the captured stdout and what the ranks printed, one line per problem."""
    counts: collections.Counter[bytes] = collections.Counter()
    next_filler: dict[int, tuple[int, int]] = {}
    next_loss: dict[int, int] = {}
    disorder: collections.Counter[int] = collections.Counter()
    alien = 0
    with open(capture, "rb") as f:
        for raw in f:
            m = LINE_RE.match(raw.rstrip(b"\n"))
            if m is None:
                alien += 1
                continue
            name, text = m.group("proc"), m.group("text")
            counts[name] += 1
            if not name.startswith(b"r"):
                continue
            rank = int(name[1:])
            if fm := FILLER_RE.match(text):
                got = (int(fm.group(2)), int(fm.group(3)))
                want = next_filler.get(rank, (1, 0))
                if int(fm.group(1)) != rank or got != want:
                    disorder[rank] += 1
                s, i = got
                next_filler[rank] = (s, i + 1) if i + 1 < per_step else (s + 1, 0)
            elif lm := LOSS_RE.match(text):
                step = int(lm.group(1))
                if step != next_loss.get(rank, 1):
                    disorder[rank] += 1
                next_loss[rank] = step + 1
            elif text not in (b"training finished",) and not text.startswith(b"fake rank "):
                alien += 1
    problems = []
    per_rank = steps * (1 + per_step) + 2
    short = {r: per_rank - counts[f"r{r}".encode()] for r in range(ranks)}
    lost = {r: d for r, d in short.items() if d}
    if lost:
        worst = sorted(lost.items(), key=lambda kv: -abs(kv[1]))[:6]
        problems.append(
            f"{len(lost)} rank(s) with missing (+) / extra (-) lines: "
            + ", ".join(f"r{r} {d:+,}" for r, d in worst)
            + (" ..." if len(lost) > 6 else "")
        )
    if counts[b"sched"] != 1:
        problems.append(f"scheduler lines: {counts[b'sched']} (want 1)")
    if disorder:
        problems.append(
            f"{sum(disorder.values()):,} out-of-sequence lines on {len(disorder)} rank(s) "
            "(gaps or reordering)"
        )
    if alien:
        problems.append(f"{alien:,} malformed lines")
    return problems


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (e.g. `timeout`): clean up like Ctrl-C (sshd nodes, temp files)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64], help="rank counts, one run each")
    p.add_argument("--lines", type=int, default=400_000, help="about this many lines per run in all")
    p.add_argument("--steps", type=int, help="steps per rank (default: from --lines)")
    p.add_argument("--lines-per-step", type=int, default=9, help="filler lines per step (plus 1 loss line)")
    p.add_argument("--repeat", type=int, default=1, help="runs per rank count")
    p.add_argument("--ssh", action="store_true", help="also run over sshd nodes on 127.0.0.2...")
    p.add_argument("--ssh-only", action="store_true", help="only the sshd runs")
    p.add_argument("--nodes", type=int, default=2, help="sshd nodes for --ssh")
    p.add_argument(
        "--max-wait-idle",
        type=float,
        default=600.0,
        help="before each run, wait up to this long for other jobs to leave the machine idle",
    )
    p.add_argument(
        "--retry-shared",
        type=int,
        default=2,
        help="run again (up to this many times) when another job used the machine meanwhile",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run before mscon is stopped")
    p.add_argument("--dev", action="store_true", help="run the working tree's mscon (PYTHONPATH=.dev)")
    a = p.parse_args(argv)
    global DEV  # noqa: PLW0603
    DEV = a.dev
    if problem := ENV.problem("mscon"):
        p.error(problem)
    modes = (["local"] if not a.ssh_only else []) + (["ssh"] if a.ssh or a.ssh_only else [])
    tmp = Path(tempfile.mkdtemp(prefix="mscon-bench-ingest-"))
    cluster = None
    results: list[Result] = []
    try:
        for mode in modes:
            if mode == "ssh" and cluster is None:
                cluster = sshd_nodes().start_sshd_cluster(tmp / "sshd", n=a.nodes)
            for n in a.ranks:
                steps = a.steps or max(1, a.lines // (n * (1 + a.lines_per_step)))
                where = "local" if mode == "local" else f"ssh x{a.nodes}"
                for i in range(1, a.repeat + 1):
                    wait_idle(a.max_wait_idle)
                    label = f"{where} N={n} #{i}"
                    print(
                        f"{label}: {n} ranks x {steps} steps x {1 + a.lines_per_step} lines "
                        f"(fake_rank.py --rate 0 --steps {steps} --lines-per-step {a.lines_per_step})",
                        flush=True,
                    )
                    node_cluster = cluster if mode == "ssh" else None
                    for attempt in range(a.retry_shared + 1):
                        res = run_once(label, n, steps, a.lines_per_step, tmp, node_cluster, a.timeout)
                        print(res.report(), flush=True)
                        if not res.shared or attempt == a.retry_shared:
                            break
                        print("  (discarded: the machine was shared; trying again)", flush=True)
                        wait_idle(a.max_wait_idle)
                    results.append(res)
                    if res.tail:
                        print("  last output:")
                        for line in res.tail:
                            print(f"    {line}")
    except KeyboardInterrupt:
        print("interrupted")
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if results:
        print()
        print(f"{'run':<22}{'lines':>10}{'lost':>8}{'wall s':>9}{'lines/s':>11}{'MB/s':>7}{'stream l/s':>12}")
        for r in results:
            stream = f"{r.lines / r.stream:,.0f}" if r.stream > 0 else "-"
            label = r.label + (" *" if r.shared else "")
            print(
                f"{label:<22}{r.lines:>10,}{r.expected - r.lines:>8,}{r.wall:>9.2f}"
                f"{r.lines / r.wall:>11,.0f}{r.nbytes / 1e6 / r.wall:>7.1f}{stream:>12}"
            )
        if any(r.shared for r in results):
            print("* other jobs used this machine meanwhile: that run's rate is too low")
    return 0 if results and not any(r.problems for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
