"""Failure to full stop: how fast a broken job is noticed, explained and gone, mscon vs msrun.

Same script (trainer/train.py --parallel-mode data_parallel, long enough to still be training when
the fault hits), same topology as bench/launch.py (NODES nodes x RANKS ranks on loopback; mscon
through real sshd nodes on 127.0.0.2, 127.0.0.3, ..., msrun as one ``--node_rank`` process per node,
node_rank > 0 running msrun's entry point with "is the master address local?" answering no).

Faults, injected from outside once the victim rank printed step --fault-step:

* ``kill9``: SIGKILL of the victim rank (default rank 3, on the second node);
* ``sigstop``: SIGSTOP of the victim rank (a hang: the process is alive, in state T);
* ``silent``: the victim stops after that step and sleeps, alive and running (the trainer's
  ``--stall-at-step``): no line, no metric, the others wait in their collective. Measured from the
  victim's last step line, as read; mscon's hang limit follows the job (no ``hang.timeout_s``).

The victim is the process whose environment has RANK_ID=R, MS_ROLE=MS_WORKER and the run's marker
(mscon: MSCON_METRICS under the run id; msrun: MS_SCHED_PORT=<this trial's port>). The job's
processes are listed just before the fault: ranks + scheduler (the same environment markers), the
node-side launchers (mscon: the agents, i.e. every non-sshd descendant of this benchmark's sshd
nodes; msrun: the msrun processes and their descendants) and the console (mscon only). A thread
then polls /proc every 10 ms and timestamps each one's end (a zombie counts as gone).

Measured from the fault (seconds):

* first error line: mscon: its first stderr line after the fault; msrun: the first line saying
  that something failed, in msrun's own output or any worker_*.log / scheduler.log (files polled
  every 10 ms; msrun's own ``Worker process <pid> exit with exception`` names a pid, not a rank);
* first line naming the rank: mscon: ``mscon: r3 on node2 failed: ...`` or ``... stopped by a
  signal ...``; msrun: the first line of those that names rank 3 (``The node: 3 is timed out``);
* root-cause summary printed: mscon's ``Root cause (first failure, ...)`` line (msrun has none);
* every rank + scheduler process gone;
* every process of the job gone: ranks, scheduler and the node-side launchers (agents / msrun);
* launcher exited: the mscon console / the last msrun process.

msrun has no hang detection: every trial has a hard cap (--cap, from the fault). A trial that
reaches it is reported as ``> cap``, and everything it started is then killed.

Restart (mscon only): ``--max-restarts 1`` with the trainer's ``--die-at-step 10 --die-rank 1``
(mscon adds --checkpoint-dir and, from attempt 1 on, --resume; --die-at-step fires on attempt 0
only). Failure = the moment rank 1's process is gone (polled every 10 ms); measured: failure ->
mscon's ``restarting`` line, and failure -> every rank of attempt 1 at its first step (the first
step line of each rank after the ``restarting`` line); checked: each rank's first step of attempt 1
is > 1 (it resumed from a checkpoint) and mscon exits 0.

Run from anywhere with a Python that has mscon, msrun and MindSpore (needs root for sshd; msrun
from .venv when the running Python has none); with the live source:

    PYTHONPATH=.dev .venv/bin/python bench/failstop.py [--repeat 2]

Every trial removes what it started: launcher process groups, any process carrying the trial's
markers (a stopped victim is continued first), the node-side run folder (agent/layout.py: under
root's home) and msrun's log folder; also on exceptions, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch import (  # bench/ is on sys.path when run as a script
    Contention,
    bench_env,
    end_bench,
    start_msrun_node,
    wait_idle,
)
from procstat import layout, node_runs, phase_medians, sshd_nodes, start_up, tool_env

REPO = Path(__file__).resolve().parent.parent
ENV = tool_env("msrun")  # the running Python's environment, else .venv's
PYTHON = ENV.python
SCRIPT = "trainer/train.py"
NODE_RUNS = node_runs("root")  # where the sshd nodes' agents (user root) keep a run's files
POLL_S = 0.01
_RUN_SEQ = itertools.count(1)

STEP_RE = re.compile(r"epoch:\s*(\d+)\s+step:\s*(\d+),\s*loss is")
MSCON_LINE_RE = re.compile(r"^\[(?P<node>\S+) (?P<proc>\S+)\] (?P<text>.*)$")
ROOT_CAUSE = "Root cause (first failure"


# ---------------------------------------------------------------- /proc


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def proc_environ(pid: int) -> dict[str, str]:
    raw = _read(f"/proc/{pid}/environ")
    if not raw:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid), or None when the process is gone."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    rest = raw[raw.rfind(b")") + 2 :].split()
    return rest[0].decode(), int(rest[1])


def alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def all_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for pid in all_pids():
        st = proc_stat(pid)
        if st is not None:
            kids[st[1]].append(pid)
    return kids


def descendants(roots: list[int], kids: dict[int, list[int]] | None = None) -> list[int]:
    kids = children_map() if kids is None else kids
    out, stack = [], list(roots)
    while stack:
        for c in kids.get(stack.pop(), ()):
            out.append(c)
            stack.append(c)
    return out


def comm(pid: int) -> str:
    raw = _read(f"/proc/{pid}/comm")
    return raw.decode(errors="replace").strip() if raw else "?"


def cmdline(pid: int) -> list[str]:
    raw = _read(f"/proc/{pid}/cmdline")
    return [w.decode(errors="replace") for w in raw.split(b"\0") if w] if raw else []


def runs_script(pid: int) -> bool:
    """A rank or scheduler: a Python running the training script (msrun's `tail -f` of a worker's
    log carries the worker's environment too)."""
    return any(w.endswith(SCRIPT) for w in cmdline(pid))


def marked(match: Any) -> list[int]:
    """Live processes whose environment satisfies ``match(env)``."""
    return [pid for pid in all_pids() if alive(pid) and (env := proc_environ(pid)) and match(env)]


class Watcher(threading.Thread):
    """Polls /proc every 10 ms; records when each watched process ends (monotonic time)."""

    def __init__(self, pids: dict[int, str]) -> None:
        super().__init__(daemon=True)
        self.pids = dict(pids)  # pid -> role
        self.gone: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for pid in self.pids:
                if pid not in self.gone and not alive(pid):
                    self.gone[pid] = now
            if len(self.gone) == len(self.pids):
                return
            time.sleep(POLL_S)

    def last_gone(self, roles: set[str]) -> float | None:
        """When the last process of these roles ended; None if one is still alive."""
        sel = [p for p, r in self.pids.items() if r in roles]
        if not sel or any(p not in self.gone for p in sel):
            return None
        return max(self.gone[p] for p in sel)


# ---------------------------------------------------------------- trials


@dataclass
class Trial:
    launcher: str  # mscon / msrun
    fault: str  # kill9 / sigstop / silent / restart
    index: int
    cap: float
    ok: bool = False
    error: str = ""
    run_id: str = ""
    fault_step: int | None = None
    victim: int | None = None
    t_start: float = 0.0
    t_fault: float | None = None
    job: dict[int, str] = field(default_factory=dict)
    # seconds from the fault; None = not seen (within the cap when capped)
    first_error: float | None = None
    first_error_line: str = ""
    notice: float | None = None
    notice_line: str = ""
    summary: float | None = None
    summary_line: str = ""
    ranks_gone: float | None = None
    job_gone: float | None = None
    exited: float | None = None
    capped: bool = False
    rcs: list[int | None] = field(default_factory=list)
    wall: float = 0.0
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (monotonic, source, text)
    foreign: int = 0
    foreign_cpu: float = 0.0
    # restart trials
    restart_line: float | None = None  # from the failure
    attempt1_first: dict[int, tuple[float, int]] = field(default_factory=dict)  # rank -> (s, step)
    resumed_line: str = ""
    first_named: str = ""  # msrun: the first error line naming any rank, and which
    backoff: float | None = None
    # mscon: its own start-up breakdown per attempt, from its summary (procstat.start_up)
    phases: list[tuple[int, str, list[tuple[str, float]]]] = field(default_factory=list)

    @property
    def shared(self) -> bool:
        return bool(self.foreign) or self.foreign_cpu > max(1.0, 0.05 * self.wall)

    @property
    def warm(self) -> bool:
        """Attempt 1 ran on the standby cluster (its breakdown says so: console/engine/phases.py)."""
        return any(n == 1 and "(warm" in text for n, text, _ in self.phases)

    @property
    def attempt1_all(self) -> float | None:
        return max(t for t, _ in self.attempt1_first.values()) if self.attempt1_first else None

    def rel(self, t: float | None) -> float | None:
        return None if t is None or self.t_fault is None else t - self.t_fault

    def line(self) -> str:
        breakdown = "".join(f"\n  mscon attempt {n}: {text}" for n, text, _ in self.phases)
        return self._line() + breakdown

    def _line(self) -> str:
        shared = ""
        if self.shared:
            shared = (
                f" [NOT ALONE: other jobs used {self.foreign_cpu:.1f} CPU-s, "
                f"up to {self.foreign} MindSpore processes]"
            )
        head = f"{self.launcher} {self.fault} #{self.index}"
        if not self.ok:
            return f"{head}: FAILED after {self.wall:.1f} s: {self.error}{shared}"

        def f(v: float | None) -> str:
            return f"> {self.cap:.0f}" if v is None and self.capped else ("-" if v is None else f"{v:.2f}")

        if self.fault == "restart":
            firsts = " ".join(f"r{r}={t:.2f}@step{s}" for r, (t, s) in sorted(self.attempt1_first.items()))
            return (
                f"{head}: restarting line {f(self.restart_line)} s after r1 died; attempt 1 first steps "
                f"{firsts}; all {f(self.attempt1_all)} s; {self.resumed_line or 'no resume line'}; "
                f"exit {self.rcs}; wall {self.wall:.1f} s{shared}"
            )

        def quoted(v: float | None, text: str) -> str:
            return f"{f(v)} s ({text[:150]!r})" if v is not None else f(v)

        return (
            f"{head}: victim pid {self.victim} after step {self.fault_step}; first error line "
            f"{quoted(self.first_error, self.first_error_line)}; rank named "
            f"{quoted(self.notice, self.notice_line)}; "
            f"summary {f(self.summary) if self.launcher == 'mscon' else 'none'}; "
            f"ranks gone {f(self.ranks_gone)}; job gone {f(self.job_gone)}; "
            f"launcher exit {f(self.exited)} (rc {self.rcs}); job: {self.job_summary()}{shared}"
        )

    def job_summary(self) -> str:
        c = collections.Counter(self.job.values())
        return ", ".join(f"{n} {r}" for r, n in sorted(c.items()))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _stop_launcher(proc: subprocess.Popen[bytes], first: int, grace_s: float) -> None:
    """``first`` to the launcher's process group (it has its own session), then KILL."""
    if proc.poll() is not None:
        return
    _signal_group(proc.pid, first)
    try:
        proc.wait(timeout=grace_s)
        return
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _kill_marked(pids: list[int], what: str) -> None:
    """SIGCONT + SIGKILL every live pid of a trial (a stopped process is continued so it can die)."""
    live = [p for p in pids if alive(p)]
    if not live:
        return
    print(f"  cleanup ({what}): killing {len(live)} leftover process(es) {live}", flush=True)
    for p in live:
        _kill(p, signal.SIGCONT)
        _kill(p, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in live) and time.monotonic() < deadline:
        time.sleep(0.05)


class Lines:
    """Timestamped lines from the launcher's pipes (mscon) or from polled log files (msrun)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[float, str, str]] = []
        self.cond = threading.Condition(self.lock)

    def add(self, source: str, text: str, t: float | None = None) -> None:
        with self.cond:
            self.items.append((time.monotonic() if t is None else t, source, text))
            self.cond.notify_all()

    def snapshot(self) -> list[tuple[float, str, str]]:
        with self.lock:
            return list(self.items)


def _pipe_reader(stream: Any, source: str, lines: Lines) -> threading.Thread:
    def run() -> None:
        for raw in stream:
            lines.add(source, raw.decode("utf-8", errors="replace").rstrip("\n"))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


class LogPoller(threading.Thread):
    """Polls every file under ``base`` (msrun's logs and outputs) every 10 ms for new whole lines."""

    def __init__(self, base: Path, lines: Lines) -> None:
        super().__init__(daemon=True)
        self.base, self.lines = base, lines
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}
        self.stop = threading.Event()

    def poll(self) -> None:
        now = time.monotonic()
        for path in sorted(self.base.rglob("*")):
            if path.suffix not in (".log", ".out") or not path.is_file():
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    data = self.partial.get(path, b"") + f.read()
                    self.offsets[path] = f.tell()
            except OSError:
                continue
            parts = data.split(b"\n")
            self.partial[path] = parts.pop()
            src = str(path.relative_to(self.base))
            for line in parts:
                self.lines.add(src, line.decode("utf-8", errors="replace"), now)

    def run(self) -> None:
        while not self.stop.wait(POLL_S):
            self.poll()
        self.poll()


# ---------------------------------------------------------------- msrun's log lines


# msrun has no root-cause report. Two things count as msrun telling the user, in its own output
# (msrun-node*.out: msrun's messages and the workers' logs it tails) or in any worker_*.log /
# scheduler.log: a line that says something failed ("first error line"), and a line that names the
# failed rank ("names the rank": MindSpore's dynamic cluster names a node by its MS_NODE_ID, which
# msrun sets to the rank, e.g. "The node: 3 is timed out", "worker 3 is the first one timed out").
# msrun's own "Worker process <pid> exit with exception" names a pid, not a rank: an error line.
_NAMED_RES = [
    re.compile(r"\bnode(?:[ _]?id)?\s*[:=]\s*\[?(\d+)\]?(?![\d.,])", re.I),
    re.compile(r"\b(?:rank|worker)(?:[ _]?id)?\s*[:=]?\s*\[?(\d+)\]?(?![\d.,])", re.I),
    re.compile(r"\bworker_(\d+)\.log"),
]
_NODE_LIST_RE = re.compile(r"node list is: [^{]*\{([\d, ]+)\}")


def msrun_named_ranks(text: str, world: int) -> set[int]:
    """The ranks an error line of msrun / MindSpore names as failed (empty: not an error line)."""
    if not MSRUN_FAILED_RE.search(text):
        return set()
    found = {int(m.group(1)) for rx in _NAMED_RES for m in rx.finditer(text)}
    for m in _NODE_LIST_RE.finditer(text):
        found |= {int(x) for x in re.findall(r"\d+", m.group(1))}
    return {r for r in found if 0 <= r < world}


MSRUN_FAILED_RE = re.compile(
    r"(exit with exception|exited with exception|timed out|timeout|abnormal|failed|"
    r"Traceback|Error|\[ERROR\]|\[CRITICAL\])",
    re.I,
)


def msrun_lines(lines: list[tuple[float, str, str]], t_fault: float, pred: Any) -> tuple[float, str] | None:
    for t, src, text in lines:
        if t >= t_fault and not STEP_RE.search(text) and pred(text):
            return t, f"{src}: {text.strip()}"
    return None


# ---------------------------------------------------------------- mscon


def write_inventory(path: Path, cluster: Any, ranks_per_node: int, sched_port: int, name: str) -> None:
    nodes = "\n".join(
        f"  - {{host: {n.host}, name: {n.name}, port: {n.port}, devices: {ranks_per_node}}}"
        for n in cluster.nodes
    )
    path.write_text(
        f"""# written by bench/failstop.py
name: {name}
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
""",
        encoding="utf-8",
    )


def _victim_of(pids: list[int], rank: int, env_ok: Any) -> int | None:
    """The rank's process: RANK_ID=rank, MS_ROLE=MS_WORKER, the trial's marker; the deepest one."""
    cand = [
        p
        for p in pids
        if (e := proc_environ(p)).get("RANK_ID") == str(rank)
        and e.get("MS_ROLE") == "MS_WORKER"
        and env_ok(e)
        and runs_script(p)
    ]
    if not cand:
        return None
    kids = children_map()
    leaves = [p for p in cand if not set(descendants([p], kids)) & set(cand)]
    return leaves[0] if len(leaves) == 1 else None


_FAULT_SIGNALS = {"kill9": signal.SIGKILL, "sigstop": signal.SIGSTOP}  # "silent": the trainer stalls


def _inject(trial: Trial, sig: int | None, victim: int, t_line: float) -> None:
    """The fault: a signal to the victim now, or (``sig`` None, a silent rank) none: the victim
    went silent after the step line read at ``t_line``."""
    if sig is None:
        trial.t_fault = t_line
        return
    os.kill(victim, sig)
    trial.t_fault = time.monotonic()


def run_mscon(
    trial: Trial,
    cluster: Any,
    a: argparse.Namespace,
    train_args: list[str],
    tmp: Path,
    port: int,
    extra: list[str] | None = None,
) -> None:
    run_id = trial.run_id = f"bench-failstop-{os.getpid()}-{next(_RUN_SEQ)}"
    inv = tmp / f"{run_id}.yaml"
    write_inventory(inv, cluster, a.ranks_per_node, port, "bench-failstop")
    cmd = [
        sys.executable,
        "-m",
        "mscon.console.cli",
        "run",
        "--no-tui",
        str(inv),
        "--logs-dir",
        str(tmp / layout.LOGS_DIR),
        "--run-id",
        run_id,
        "--json",
        str(tmp / f"{run_id}.json"),
        *(extra or []),
        "--",
        SCRIPT,
        *train_args,
    ]
    lines = Lines()
    marker = f"/{run_id}/"

    def ours(env: dict[str, str]) -> bool:
        return marker in env.get("MSCON_METRICS", "")

    sshd_pids = [n.pid for n in cluster.nodes]
    trial.t_start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=tmp,
        env=bench_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    readers = [_pipe_reader(proc.stdout, "stdout", lines), _pipe_reader(proc.stderr, "stderr", lines)]
    watcher: Watcher | None = None
    known: set[int] = set()  # every rank/scheduler pid ever seen (for the cleanup)
    try:
        if trial.fault == "restart":
            _restart_trial(trial, proc, lines, ours, known, a)
            return
        sig = _FAULT_SIGNALS.get(trial.fault)
        want = re.compile(rf"^\[\S+ r{a.rank}\] .*?{STEP_RE.pattern}")
        deadline = trial.t_start + a.timeout
        seen = 0
        while trial.t_fault is None:
            for t_line, src, text in lines.snapshot()[seen:]:
                seen += 1
                if src == "stdout" and (m := want.match(text)) and int(m.group(2)) >= a.fault_step:
                    trial.fault_step = int(m.group(2))
                    ranks = marked(ours)
                    known.update(ranks)
                    victim = _victim_of(ranks, a.rank, ours)
                    if victim is None:
                        raise RuntimeError(f"rank {a.rank}'s process not found among {ranks}")
                    kids = children_map()
                    job = {p: "rank" if runs_script(p) else "launcher" for p in ranks}
                    for p in descendants(sshd_pids, kids):
                        if p not in job and not comm(p).startswith("sshd") and alive(p):
                            job[p] = "launcher"  # the agents (and any shell between sshd and them)
                    job[proc.pid] = "console"
                    trial.job, trial.victim = job, victim
                    watcher = Watcher(job)
                    _inject(trial, sig, victim, t_line)
                    watcher.start()
                    break
            if trial.t_fault is not None:
                break
            if proc.poll() is not None:
                raise RuntimeError(
                    f"mscon exited ({proc.returncode}) before r{a.rank} reached step {a.fault_step}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"r{a.rank} did not reach step {a.fault_step} within {a.timeout:.0f} s")
            time.sleep(POLL_S)
        try:
            proc.wait(timeout=max(0.0, trial.t_fault + a.cap - time.monotonic()))
            trial.exited = time.monotonic() - trial.t_fault
        except subprocess.TimeoutExpired:
            trial.capped = True
        trial.rcs = [proc.returncode]
        assert watcher is not None
        if not trial.capped:  # the node side may still be going away: give it the rest of the cap
            end = trial.t_fault + a.cap
            while watcher.is_alive() and time.monotonic() < end:
                time.sleep(POLL_S)
        watcher.stop.set()
        for t in readers:
            t.join(timeout=5)
        trial.ranks_gone = trial.rel(watcher.last_gone({"rank"}))
        trial.job_gone = trial.rel(watcher.last_gone({"rank", "launcher"}))
        snap = lines.snapshot()
        who = re.compile(rf"^mscon: r{a.rank} on \S+ (failed|stopped by a signal|makes no progress)")
        for t, src, text in snap:
            if src != "stderr" or t < trial.t_fault:
                continue
            if trial.first_error is None and text.startswith("mscon: "):
                trial.first_error, trial.first_error_line = t - trial.t_fault, text
            if trial.notice is None and who.match(text):
                trial.notice, trial.notice_line = t - trial.t_fault, text
            if trial.summary is None and text.startswith(ROOT_CAUSE):
                trial.summary = t - trial.t_fault
                trial.summary_line = text
        trial.lines = snap
        if trial.capped:
            trial.ok = True  # an honest "> cap"
        elif proc.returncode == 0:
            trial.error = "mscon exited 0 after the fault"
        elif trial.summary is None or f"r{a.rank} on" not in trial.summary_line:
            trial.error = f"no root cause naming r{a.rank}: {trial.summary_line or '(none printed)'}"
        else:
            trial.ok = True
    finally:
        trial.wall = time.monotonic() - trial.t_start
        if watcher is not None:
            watcher.stop.set()
        _stop_launcher(proc, signal.SIGINT, 20.0)  # SIGINT: mscon stops the ranks on every node
        for t in readers:
            t.join(timeout=5)
        if not trial.lines:
            trial.lines = lines.snapshot()
        leftovers = set(marked(ours)) | {p for p in known if alive(p)} | {p for p in trial.job if alive(p)}
        leftovers.discard(os.getpid())
        _kill_marked(sorted(leftovers), f"mscon {trial.fault} #{trial.index}")
        shutil.rmtree(NODE_RUNS / run_id, ignore_errors=True)
        trial.phases = start_up(tmp / f"{run_id}.json")


def _restart_trial(
    trial: Trial,
    proc: subprocess.Popen[bytes],
    lines: Lines,
    ours: Any,
    known: set[int],
    a: argparse.Namespace,
) -> None:
    """--max-restarts 1, rank 1 kills itself at step 10: failure -> attempt 1 back at work."""
    die_rank = 1
    deadline = trial.t_start + a.timeout + a.cap
    victim = None
    died: float | None = None
    next_scan = 0.0
    while True:
        now = time.monotonic()
        if victim is None and now >= next_scan:
            next_scan = now + 0.2
            ranks = marked(ours)
            known.update(ranks)
            victim = _victim_of(ranks, die_rank, lambda e: ours(e) and e.get("MSCON_ATTEMPT", "0") == "0")
            trial.victim = victim
        elif victim is not None and died is None and not alive(victim):
            died = now
            trial.t_fault = died
        if died is not None or proc.poll() is not None or now > deadline:
            break
        time.sleep(POLL_S)
    if died is None:
        trial.error = (
            f"rank {die_rank}'s process {'never found' if victim is None else 'did not die'}"
            f" (mscon rc {proc.poll()})"
        )
        return
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        trial.error = f"the restarted run did not finish within {a.timeout + a.cap:.0f} s"
        return
    trial.rcs = [proc.returncode]
    time.sleep(0.2)
    snap = trial.lines = lines.snapshot()
    t_restart = next(
        (t for t, s, x in snap if s == "stderr" and x.startswith("mscon: restarting") and t >= died), None
    )
    trial.restart_line = trial.rel(t_restart)
    for t, src, text in snap:
        if src == "stderr" and t >= died:
            if trial.notice is None and text.startswith(f"mscon: r{die_rank} on "):
                trial.notice, trial.notice_line = t - died, text
            if trial.backoff is None and (m := re.match(r"mscon: restarting .* in ([\d.]+) s", text)):
                trial.backoff = float(m.group(1))
    for t, src, text in snap:
        if src == "stdout" and "--die-at-step" in text and trial.fault_step is None:
            trial.fault_step = 10
        if t_restart is None or t < t_restart or src != "stdout":
            continue
        m = MSCON_LINE_RE.match(text)
        if m is None:
            continue
        name, body = m.group("proc"), m.group("text")
        if "resumed from step" in body and not trial.resumed_line:
            trial.resumed_line = f"[{m.group('node')} {name}] {body}"
        if name.startswith("r") and name[1:].isdigit() and (s := STEP_RE.search(body)):
            trial.attempt1_first.setdefault(int(name[1:]), (t - died, int(s.group(2))))
    world = a.nodes * a.ranks_per_node
    problems = []
    if t_restart is None:
        problems.append("no 'mscon: restarting' line")
    if len(trial.attempt1_first) < world:
        problems.append(f"only ranks {sorted(trial.attempt1_first)} stepped in attempt 1")
    low = [r for r, (_, s) in trial.attempt1_first.items() if s <= 1]
    if low:
        problems.append(f"ranks {low} started attempt 1 at step 1 (no resume)")
    if proc.returncode != 0:
        problems.append(f"mscon exited {proc.returncode}")
    trial.error = "; ".join(problems)
    trial.ok = not problems


# ---------------------------------------------------------------- msrun


def run_msrun(trial: Trial, a: argparse.Namespace, train_args: list[str], tmp: Path, port: int) -> None:
    world = a.nodes * a.ranks_per_node
    base = Path(tempfile.mkdtemp(prefix=f"msrun-{trial.fault}-{trial.index}-", dir=tmp))
    trial.run_id = base.name
    lines = Lines()
    poller = LogPoller(base, lines)
    procs: list[subprocess.Popen[bytes]] = []
    outs = []
    watcher: Watcher | None = None
    sig = _FAULT_SIGNALS.get(trial.fault)
    needle = str(port)

    def ours(env: dict[str, str]) -> bool:
        return env.get("MS_SCHED_PORT") == needle

    known: set[int] = set()
    trial.t_start = time.monotonic()
    try:
        for node in range(a.nodes):
            proc, out = start_msrun_node(base, node, a.nodes, a.ranks_per_node, port, train_args)
            procs.append(proc)
            outs.append(out)  # closed in finally
        poller.start()
        victim_log = f"node{a.rank // a.ranks_per_node}/worker_{a.rank}.log"
        deadline = trial.t_start + a.timeout
        seen = 0
        while trial.t_fault is None:
            for t_line, src, text in lines.snapshot()[seen:]:
                seen += 1
                if src == victim_log and (m := STEP_RE.search(text)) and int(m.group(2)) >= a.fault_step:
                    trial.fault_step = int(m.group(2))
                    kids = children_map()
                    tree = descendants([p.pid for p in procs], kids)
                    ranks = sorted(set(marked(ours)) | {p for p in tree if ours(proc_environ(p))})
                    known.update(ranks)
                    victim = _victim_of(ranks, a.rank, ours)
                    if victim is None:
                        raise RuntimeError(f"rank {a.rank}'s process not found among {ranks}")
                    job = {p: "rank" if runs_script(p) else "launcher" for p in ranks}
                    for p in [*(x.pid for x in procs), *tree]:
                        if p not in job and alive(p):
                            job[p] = "launcher"  # msrun itself (and anything else it runs)
                    trial.job, trial.victim = job, victim
                    watcher = Watcher(job)
                    _inject(trial, sig, victim, t_line)
                    watcher.start()
                    break
            if trial.t_fault is not None:
                break
            if all(p.poll() is not None for p in procs):
                raise RuntimeError(
                    f"msrun exited {[p.returncode for p in procs]} "
                    f"before rank {a.rank} reached step {a.fault_step}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank {a.rank} did not reach step {a.fault_step} within {a.timeout:.0f} s"
                )
            time.sleep(POLL_S)
        assert watcher is not None
        end = trial.t_fault + a.cap
        while time.monotonic() < end:
            if all(p.poll() is not None for p in procs) and not watcher.is_alive():
                break
            time.sleep(POLL_S)
        if all(p.poll() is not None for p in procs):
            trial.exited = max(watcher.gone.get(p.pid, time.monotonic()) for p in procs) - trial.t_fault
        else:
            trial.capped = True
        watcher.stop.set()
        trial.rcs = [p.poll() for p in procs]
        trial.ranks_gone = trial.rel(watcher.last_gone({"rank"}))
        trial.job_gone = trial.rel(watcher.last_gone({"rank", "launcher"}))
        poller.stop.set()
        poller.join(timeout=5)
        snap = trial.lines = lines.snapshot()
        hit = msrun_lines(snap, trial.t_fault, MSRUN_FAILED_RE.search)
        if hit is not None:
            trial.first_error, trial.first_error_line = hit[0] - trial.t_fault, hit[1]
        world = a.nodes * a.ranks_per_node
        hit = msrun_lines(snap, trial.t_fault, lambda x: a.rank in msrun_named_ranks(x, world))
        if hit is not None:
            trial.notice, trial.notice_line = hit[0] - trial.t_fault, hit[1]
        hit = msrun_lines(snap, trial.t_fault, lambda x: bool(msrun_named_ranks(x, world)))
        if hit is not None:
            named = sorted(msrun_named_ranks(hit[1], world))
            trial.first_named = f"{hit[0] - trial.t_fault:.2f} s, names rank(s) {named}: {hit[1]}"
        trial.ok = True
    finally:
        trial.wall = time.monotonic() - trial.t_start
        if watcher is not None:
            watcher.stop.set()
        if trial.victim is not None:
            _kill(trial.victim, signal.SIGCONT)
        for p in procs:
            _stop_launcher(p, signal.SIGINT, 10.0)  # msrun's SIGINT handler kills its workers
        poller.stop.set()
        if poller.is_alive():
            poller.join(timeout=5)
        for out in outs:
            out.close()
        if not trial.lines:
            trial.lines = lines.snapshot()
        leftovers = set(marked(ours)) | {p for p in known if alive(p)} | {p for p in trial.job if alive(p)}
        leftovers.discard(os.getpid())
        _kill_marked(sorted(leftovers), f"msrun {trial.fault} #{trial.index}")
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------- report


CAPPED = float("inf")  # still going at the cap
NEVER = 1e12  # the trial ended without it


def _val(t: Trial, v: float | None) -> float:
    return v if v is not None else CAPPED if t.capped else NEVER


def _one(v: float, cap: float) -> str:
    return f"> {cap:.0f}" if v == CAPPED else "never" if v == NEVER else f"{v:.2f}"


def _median(values: list[float]) -> tuple[float, float]:
    """(low, high) middle values; equal unless an even count straddles a '> cap' / 'never'."""
    lo, hi = statistics.median_low(values), statistics.median_high(values)
    if max(lo, hi) < NEVER:
        m = statistics.median(values)
        return m, m
    return lo, hi


def _fmt(values: list[float], cap: float) -> str:
    """median (min); 'a-b' for the median of an even count that straddles '> cap' or 'never'."""
    if not values:
        return "-"
    lo, hi = _median(values)
    med = _one(lo, cap) if lo == hi else f"{_one(lo, cap)} or {_one(hi, cap)}"
    return f"{med} ({_one(min(values), cap)})"


def _ratio(a: list[float], b: list[float], cap: float) -> str:
    """mscon/msrun of the medians; an msrun median past the cap gives an upper bound."""
    if not a or not b:
        return "-"
    ma, mb = _median(a)[1], _median(b)[0]  # the pessimistic reading for mscon
    if ma >= NEVER or mb <= 0 or NEVER <= mb < CAPPED:
        return "-"
    if mb == CAPPED:
        return f"< {ma / cap:.2g}x"
    return f"{ma / mb:.2g}x"


def report(trials: list[Trial], a: argparse.Namespace) -> None:
    print()
    head = ("seconds from the fault", "mscon median (min)", "msrun median (min)", "mscon/msrun")
    rows = [
        ("first error line", lambda t: t.first_error),
        ("first line naming the rank", lambda t: t.notice),
        ("root-cause summary printed", lambda t: t.summary),
        ("every rank + scheduler gone", lambda t: t.ranks_gone),
        ("+ agents / msrun gone", lambda t: t.job_gone),
        ("launcher exited", lambda t: t.exited),
    ]
    titles = (("kill9", "kill -9"), ("sigstop", "SIGSTOP"), ("silent", "silence (alive, no output)"))
    for fault, title in titles:
        sel = {
            n: [t for t in trials if t.fault == fault and t.launcher == n and t.ok]
            for n in ("mscon", "msrun")
        }
        if not any(sel.values()):
            continue
        print(f"{title} of rank {a.rank} after its step {a.fault_step}:")
        print(f"  {head[0]:<30}{head[1]:>22}{head[2]:>22}{head[3]:>14}")
        for label, get in rows:
            va = [_val(t, get(t)) for t in sel["mscon"]]
            vb = [_val(t, get(t)) for t in sel["msrun"]]
            if label.startswith("root-cause"):
                vb = []  # msrun prints none
            col_b = _fmt(vb, a.cap) if sel["msrun"] and vb else ("none" if sel["msrun"] else "-")
            ratio = _ratio(va, vb, a.cap) if vb else "-"
            print(f"  {label:<30}{_fmt(va, a.cap):>22}{col_b:>22}{ratio:>14}")
        for t in sel["msrun"]:
            print(f"  msrun #{t.index}: first error line: {t.first_error_line[:150] or '(none)'}")
            print(f"  msrun #{t.index}: names rank {a.rank}: {t.notice_line[:150] or '(none)'}")
            print(f"  msrun #{t.index}: first line naming any rank: {t.first_named[:170] or '(none)'}")
        print()
    rs = [t for t in trials if t.fault == "restart"]
    if rs:
        ok = [t for t in rs if t.ok]
        backoff = sorted({t.backoff for t in rs if t.backoff is not None})
        print(
            f"restart (mscon --max-restarts 1; r1 kills itself after its step {a.restart_die_step}; "
            f"checkpoints every 10 steps; warm restarts: {sum(bool(t.warm) for t in ok)} of {len(ok)};"
            f" restart.backoff_s {'/'.join(f'{b:g}' for b in backoff) or '?'} s, included below):"
        )
        print(f"  {'seconds from r1 gone':<46}{'median (min)':>20}")
        for label, vals in (
            ("mscon names r1 (r1 on node1 failed)", [_val(t, t.notice) for t in ok]),
            ("mscon prints 'restarting'", [_val(t, t.restart_line) for t in ok]),
            ("every rank of attempt 1 at its first step", [_val(t, t.attempt1_all) for t in ok]),
        ):
            print(f"  {label:<46}{_fmt(vals, a.cap):>20}")
        timed = [took for t in ok for n, _, took in t.phases if n == 1]
        if timed:
            print("  mscon's own breakdown of the restart (median s, each after the one before):")
            print(f"    {phase_medians(timed)}")
        for t in rs:
            steps = ", ".join(f"r{r} {s}" for r, (_, s) in sorted(t.attempt1_first.items()))
            verdict = f"exit {t.rcs[0] if t.rcs else '?'}" if t.ok else f"NOT OK: {t.error}"
            print(
                f"  #{t.index}: attempt 1's first steps: {steps or '-'}; {t.resumed_line or 'no resume line'}"
            )
            print(f"      {verdict}")
        print()
    launches = [took for t in trials if t.ok for n, _, took in t.phases if n == 0]
    if launches:
        print("mscon's own breakdown of its launches (median s, each after the one before, every trial):")
        print(f"  {phase_medians(launches)}")
        print()
    shared = [f"{t.launcher} {t.fault} #{t.index}" for t in trials if t.shared]
    if shared:
        print(
            f"WARNING: other jobs used the machine during {', '.join(shared)}: those timings may be inflated"
        )
    failed = [t for t in trials if not t.ok]
    print(
        f"trials: {len(trials)}, failed: {len(failed)}"
        + (f" ({', '.join(f'{t.launcher} {t.fault} #{t.index}' for t in failed)})" if failed else "")
    )
    print(
        "notes: mscon's rank lines pass through the agent (flushed every 0.1 s), its notices are\n"
        "stderr lines read as they come; msrun's logs are polled every 0.01 s; processes are polled\n"
        "every 0.01 s in /proc (a zombie counts as gone). '> N': not within the cap of N s after the\n"
        "fault (the trial's processes were then killed); 'never': the trial ended without it;\n"
        "'a or b': an even number of trials whose middle two are a and b."
    )


def _dump(trial: Trial, n: int) -> None:
    if trial.t_fault is None:
        tail = trial.lines[-n:]
        print("  last lines:")
    else:
        tail = [x for x in trial.lines if x[0] >= trial.t_fault - 0.5][:n]
        print(f"  lines from 0.5 s before the fault (first {n}):")
    t0 = trial.t_fault if trial.t_fault is not None else trial.t_start
    for t, src, text in tail:
        print(f"    {t - t0:+8.3f} {src}: {text[:220]}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (e.g. `timeout`): clean up like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2, help="trials per launcher and fault")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--steps", type=int, default=200, help="--steps-per-epoch (1 epoch)")
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--rank", type=int, default=3, help="the victim rank")
    p.add_argument("--fault-step", type=int, default=20, help="inject once the victim printed this step")
    p.add_argument(
        "--faults",
        nargs="+",
        choices=("kill9", "sigstop", "silent", "restart"),
        default=["kill9", "sigstop", "restart"],
    )
    p.add_argument("--only", choices=("mscon", "msrun"), help="one launcher only (restart is mscon only)")
    p.add_argument("--restart-steps", type=int, default=40, help="--steps-per-epoch of the restart trials")
    p.add_argument(
        "--restart-die-step",
        type=int,
        default=10,
        help="r1 kills itself after this step in the restart trials (later: the agents' spare processes "
        "have finished importing MindSpore by then)",
    )
    p.add_argument("--timeout", type=float, default=240.0, help="s from start until the fault step, at most")
    p.add_argument("--cap", type=float, default=180.0, help="s from the fault until the trial is stopped")
    p.add_argument(
        "--max-wait-idle", type=float, default=120.0, help="wait up to this long for an idle machine"
    )
    p.add_argument("--dump", type=int, default=0, help="print this many timestamped lines around each fault")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, inventories)")
    a = p.parse_args(argv)
    world = a.nodes * a.ranks_per_node
    if world > 4:
        p.error("at most 4 MindSpore ranks at once on this machine")
    if not 0 <= a.rank < world:
        p.error("--rank out of range")
    if a.repeat < 1:
        p.error("--repeat must be >= 1")
    if problem := ENV.problem("msrun"):
        p.error(problem)
    train_args = [
        "--parallel-mode", "data_parallel", "--epochs", "1",
        "--steps-per-epoch", str(a.steps), "--step-sleep", str(a.step_sleep),
    ]  # fmt: skip
    # The victim stops after --fault-step and sleeps (0: for ever); the others wait in AllReduce.
    silent_args = [*train_args, "--stall-at-step", str(a.fault_step + 1), "--stall-rank", str(a.rank)]
    restart_args = [
        "--parallel-mode", "data_parallel", "--epochs", "1",
        "--steps-per-epoch", str(a.restart_steps), "--step-sleep", str(a.step_sleep),
        "--die-at-step", str(a.restart_die_step), "--die-rank", "1",
    ]  # fmt: skip
    exe = Path(sys.executable)
    exe_s = str(exe.relative_to(REPO)) if exe.is_relative_to(REPO) else str(exe)
    pp = os.environ.get("PYTHONPATH")
    print(
        "failure-to-stop benchmark: "
        + (f"PYTHONPATH={shlex.quote(pp)} " if pp else "")
        + shlex.join([exe_s, *sys.argv])
        + f"   # in {os.getcwd()}"
    )
    print(
        f"{a.nodes} nodes x {a.ranks_per_node} ranks (world {world}) on loopback; "
        f"victim rank {a.rank} after its step {a.fault_step}"
    )
    print(f"script: {SCRIPT} {' '.join(train_args)}")
    if "silent" in a.faults:
        print(f"silent: the same, and {' '.join(silent_args[len(train_args) :])}")
    if "restart" in a.faults and a.only != "msrun":
        print(f"restart: mscon run --max-restarts 1 -- {SCRIPT} {' '.join(restart_args)}")
    print(
        f"cap: {a.cap:.0f} s after the fault; {a.repeat} trial(s) per launcher and fault, order alternating"
    )

    tmp = Path(tempfile.mkdtemp(prefix="mscon-bench-failstop-"))
    cluster = None
    trials: list[Trial] = []
    watch = Contention()
    watch.start()
    try:
        if a.only != "msrun":
            cluster = sshd_nodes().start_sshd_cluster(tmp / "sshd", n=a.nodes)
            print(f"sshd nodes: {', '.join(f'{n.host}:{n.port}' for n in cluster.nodes)}", flush=True)
        launchers = ["mscon", "msrun"] if a.only is None else [a.only]
        plan = []
        for fault in [f for f in a.faults if f != "restart"]:
            for i in range(1, a.repeat + 1):
                for name in launchers if i % 2 else launchers[::-1]:
                    plan.append((name, fault, i))
        if "restart" in a.faults and a.only != "msrun":
            plan += [("mscon", "restart", i) for i in range(1, a.repeat + 1)]
        for name, fault, i in plan:
            wait_idle(watch, a.max_wait_idle)
            hosts = ["127.0.0.1", *(f"127.0.0.{k + 2}" for k in range(a.nodes))]
            port = sshd_nodes().find_free_port(hosts)
            watch.reset(port)
            trial = Trial(name, fault, i, a.cap)
            try:
                if name == "mscon" and fault == "restart":
                    run_mscon(trial, cluster, a, restart_args, tmp, port, ["--max-restarts", "1"])
                elif name == "mscon":
                    run_mscon(trial, cluster, a, silent_args if fault == "silent" else train_args, tmp, port)
                else:
                    run_msrun(trial, a, silent_args if fault == "silent" else train_args, tmp, port)
            except (RuntimeError, OSError) as exc:
                trial.error = str(exc)
                trial.ok = False
            watch.sample()
            trial.foreign, trial.foreign_cpu = watch.peak, watch.cpu
            trials.append(trial)
            print(trial.line(), flush=True)
            if not trial.ok or a.dump:
                _dump(trial, a.dump or 60)
    except KeyboardInterrupt:
        print("interrupted; partial results:")
    finally:
        end_bench(watch, cluster, tmp, a.keep)
    report(trials, a)
    return 0 if trials and all(t.ok for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
