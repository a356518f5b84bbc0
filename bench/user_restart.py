"""A user's own script restarted: MindSpore's msrun sample (examples/net.py, with mscon_resume's
three lines) on 2 sshd nodes x 2 ranks under ``mscon run --max-restarts 1``, rank 1 SIGKILLed late.

The script is the docs' hand-written loop; the data is bench/fake_mnist.py's (--samples 2560: 4
ranks x batch 32 = 20 steps an epoch, 200 steps in net.py's 10 epochs). Per trial, rank 1 (its
process: RANK_ID=1, MS_WORKER, attempt 0) is killed with SIGKILL as soon as its MSCON_METRICS file
(``layout.metrics_path(node run folder, 0, "r1")``, one JSON line per step) says step >=
--fault-step (default 150). mscon restarts the group once; the trial waits for it to finish. From
the kill (time.time(), the clock of the ranks' "ts" too):

* (a) every rank of attempt 1 at its first step: max over ranks of the "ts" of the first step
  record in attempt_1's metrics file, minus the kill time;
* (b) every rank's next loss line (``epoch: E, step: I, loss is X``: net.py prints every 10th step)
  on mscon's stdout, timestamped as read (a later step than (a): the resumed step count runs up to
  the next multiple of 10 first);
* (c) steps lost: the last step every rank completed in attempt 0 (attempt_0's metrics files)
  minus the step attempt 1 resumed after (its ``{"resume": {"step": N, ...}}`` record).

Checked per trial and printed: every rank resumed at the same step from a snapshot; at most one
step lost; no loss line printed in both attempts by the same rank (a step done twice); attempt 1
warm (mscon's start-up breakdown of it, in the --json summary, says "(warm"); mscon exited 0.

``--unmodified``: the same with the original sample, net.py with its three ``# mscon_resume``
lines stripped (the import removed, the other two reverted), written into each trial's workdir.
It writes no step records, so the kill goes in once rank 1's loss line on mscon's stdout says
global step (E x 20 + I + 1) >= --fault-step (151 for 150), (a) is the first loss line of every
rank in attempt 1 (printed after step 1), and steps lost is the last step printed in attempt 0 by
every rank (a lower bound: up to 9 more went unprinted) minus 0, where it starts over.

``--fault-after-s S``: the kill goes in S seconds after every rank of attempt 0 made its first
step (its first step record's "ts") instead: an early fault (issue 43: 1 s into training restarts
warm once the spares start with a cold attempt). ``--max-restarts 2``: still one fault, but attempt 1
has budget left, so it prepares spares of its own (what they cost a warm restart).

``--second-fault-after-s S`` (needs ``--max-restarts 2``): a second fault, r1 of attempt 1 killed S
seconds after every rank of attempt 1 made its first step (issue 43: a fault soon after a warm
restart). (a), (b) and (c) are then measured from that kill, on attempt 2 (warm or cold, its
breakdown says), against attempt 1; the first restart's warm or cold is printed too.

``--model resnet18``: the model-zoo case instead (issue 43): MindCV 0.3's ResNet-18 built as MindCV's
train.py builds it, with ResumeCallback (bench/mindcv_resnet.py; synthetic images, ``--samples`` per
rank, ``--epochs``), the same nodes and fault. Its compiled graphs are kept on the nodes and loaded
by the restart (``--graph-cache off``: compiled again, for the comparison); each trial prints both
attempts' start-up breakdowns (the cold start, and the restart's stop, spawn, import, join, data,
compile or graph load, first step).

Needs root (sshd) and mscon + MindSpore in the running Python (else in .venv); ``--model resnet18``
also MindCV (``pip install mindcv==0.3.0``, pyproject's ``bench-mindcv`` group). Run from anywhere:

    .venv/bin/python bench/user_restart.py [--repeat 3] [--fault-step 150] [--unmodified]
    .venv/bin/python bench/user_restart.py --model resnet18 --samples 160 --epochs 4 --fault-step 60

Prints the command, one line per trial and p50/min/max of (a), (b) and (c). The machine has 2
cores: each trial waits until other jobs leave it idle (bench/launch.py) and says when one ran
during it. Everything a trial starts is removed after it, also on Ctrl-C and SIGTERM: mscon's
process group, any process carrying the run's marker, the node-side run folders and the ranks'
snapshot folders in /dev/shm; the sshd nodes and the scratch folder at the end.
"""

from __future__ import annotations

import argparse
import json
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

import yaml
from failstop import _kill_marked, _stop_launcher, alive, cmdline, marked, proc_environ, proc_stat
from fake_mnist import write_fake_mnist
from launch import MSCON_LINE_RE, Contention, bench_env, end_bench, wait_idle
from procstat import layout, node_runs, sshd_nodes, start_up, tool_env

REPO = Path(__file__).resolve().parent.parent
ENV = tool_env("mscon")
PYTHON = ENV.python
SCRIPT = "net.py"
EXAMPLE = REPO / "examples" / SCRIPT
NODE_RUNS = node_runs("root")  # where the sshd nodes' agents (user root) keep a run's files
BATCH = 32  # net.py's create_dataset(32)
# --model: the script the job runs, where it comes from, and its batch size
MODELS = {
    "net": (SCRIPT, EXAMPLE, BATCH),
    "resnet18": ("mindcv_resnet.py", REPO / "bench" / "mindcv_resnet.py", 8),
}
POLL_S = 0.01
SPARE_BOOT = "spare_boot.py"  # agent/spares.py: a spare rank runs this, then becomes the rank
LOSS_RE = re.compile(r"^epoch: ?(\d+),? step: ?(\d+), loss is (.+)$")
MARK = "# mscon_resume"
# The original sample's lines where examples/net.py has mscon_resume's (docs/resume.md).
ORIGINAL = {
    "grad_fn": "grad_fn = ms.value_and_grad(forward_fn, None, net.trainable_params(), has_aux=True)",
    "for i,": "for data, label in data_set:",
}


def stripped_net_py() -> str:
    """examples/net.py without mscon_resume: the import dropped, the other two lines as the
    sample has them (same indentation)."""
    out = []
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        if not line.rstrip().endswith(MARK):
            out.append(line)
            continue
        body = line.strip()
        if body.startswith("import mscon_resume"):
            continue
        indent = line[: len(line) - len(line.lstrip())]
        key = next((k for k in ORIGINAL if body.startswith(k)), None)
        if key is None:
            raise RuntimeError(f"examples/net.py: an mscon_resume line this bench does not know: {body}")
        out.append(indent + ORIGINAL[key])
    leftover = [x for x in out if "mscon_resume" in x and not x.lstrip().startswith("#")]
    if leftover:
        raise RuntimeError(f"stripped net.py still uses mscon_resume: {leftover}")
    return "\n".join(out) + "\n"


def write_inventory(
    path: Path, cluster: Any, ranks_per_node: int, port: int, work: Path, data: Path, a: argparse.Namespace
) -> None:
    script, _, batch = MODELS[a.model]
    env = {"GLOG_v": "3", "DATA_PATH": str(data), "MSCON_GRAPH_CACHE": a.graph_cache}
    if a.model == "resnet18":
        env.update(SAMPLES=str(a.samples), BATCH=str(batch), EPOCHS=str(a.epochs), IMAGE=str(a.image))
    doc = {
        "name": "bench-user-restart",
        "device_target": "CPU",
        "defaults": {
            "user": "root",
            "transport": "ssh",
            "identity_file": str(cluster.client_key),
            "python": str(PYTHON),
        },
        "nodes": [
            {"host": n.host, "name": n.name, "port": n.port, "devices": ranks_per_node} for n in cluster.nodes
        ],
        "scheduler": {"port": port},
        "job": {"workdir": str(work), "script": script, "env": env},
        "ssh": {"known_hosts": str(cluster.known_hosts)},
        "stop": {"grace_s": 3},
    }
    path.write_text(
        "# written by bench/user_restart.py\n" + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8"
    )


# ---------------------------------------------------------------- one trial


@dataclass
class Trial:
    index: int
    world: int
    ok: bool = False
    error: str = ""
    t_start: float = 0.0  # wall clock (time.time()), as the ranks' metrics
    t_kill: float | None = None  # the measured fault's (the second one's with --second-fault-after-s)
    measured: int = 1  # the attempt the measured fault restarts into
    phases_first: str = ""  # with a second fault: mscon's breakdown of attempt 1 (the first restart)
    kill_step: int | None = None  # r1's step when killed (its metrics; --unmodified: its loss line)
    trained0: float | None = None  # s from every rank of the faulted attempt at its first step to the kill
    rc: int | None = None
    first_step: dict[int, float] = field(default_factory=dict)  # rank -> s from the kill, attempt 1
    first_line: dict[int, tuple[float, str]] = field(default_factory=dict)  # rank -> (s, text), attempt 1
    last0: dict[int, int] = field(default_factory=dict)  # rank -> last step in attempt 0
    resumed: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> attempt 1's resume record
    twice: dict[int, list[str]] = field(default_factory=dict)  # rank -> loss lines in both attempts
    restart_line: float | None = None  # "mscon: restarting", s from the kill
    phases0: str = ""  # mscon's breakdown of attempt 0 (the cold start)
    phases1: str = ""  # mscon's breakdown of attempt 1
    verdict: str = ""  # the summary's word on attempt 1's resume
    outcomes: list[str] = field(default_factory=list)
    foreign: int = 0
    foreign_cpu: float = 0.0
    wall: float = 0.0
    tail: list[str] = field(default_factory=list)

    @property
    def all_first_step(self) -> float | None:
        return max(self.first_step.values()) if len(self.first_step) == self.world else None

    @property
    def all_first_line(self) -> float | None:
        return max(t for t, _ in self.first_line.values()) if len(self.first_line) == self.world else None

    @property
    def last_common(self) -> int | None:
        return min(self.last0.values()) if len(self.last0) == self.world else None

    @property
    def resume_step(self) -> int | None:
        steps = {r.get("step") for r in self.resumed.values()}
        return steps.pop() if len(steps) == 1 and len(self.resumed) == self.world else None

    @property
    def lost(self) -> int | None:
        if self.last_common is None or self.resume_step is None:
            return None
        return self.last_common - self.resume_step

    @property
    def warm(self) -> bool:
        return "(warm" in self.phases1

    @property
    def shared(self) -> bool:
        return bool(self.foreign) or self.foreign_cpu > max(1.0, 0.05 * self.wall)


class Reader:
    """mscon's stdout and stderr, each line stamped with time.time() as read."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[float, str, str]] = []
        self.threads = [self._start(proc.stdout, "stdout"), self._start(proc.stderr, "stderr")]

    def _start(self, stream: Any, src: str) -> threading.Thread:
        def run() -> None:
            for raw in stream:
                text = raw.decode("utf-8", errors="replace").rstrip("\n")
                with self.lock:
                    self.items.append((time.time(), src, text))

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def snapshot(self) -> list[tuple[float, str, str]]:
        with self.lock:
            return list(self.items)

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=5)


def records(path: Path) -> list[dict[str, Any]]:
    """The whole JSON lines of a metrics file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(rec, dict):
            out.append(rec)
    return out


def last_step(path: Path) -> int:
    return max((r["step"] for r in records(path) if isinstance(r.get("step"), int)), default=0)


def rank_process(pids: list[int], rank: int, ours: Any, script: str = SCRIPT, attempt: int = 0) -> int | None:
    """Rank ``rank``'s own process in ``attempt`` (the one whose parent is none of the candidates:
    a process it forked carries its environment and command line too; a spare that became the rank
    carries the environment it was started with, its attempt's)."""
    cands = [
        p
        for p in pids
        if (e := proc_environ(p)).get("RANK_ID") == str(rank)
        and e.get("MS_ROLE") == "MS_WORKER"
        and e.get("MSCON_ATTEMPT", "0") == str(attempt)
        and ours(e)
        and any(w.endswith((script, SPARE_BOOT)) for w in cmdline(p))
    ]
    roots = [p for p in cands if (st := proc_stat(p)) is not None and st[1] not in cands]
    return roots[0] if len(roots) == 1 else None


def trained_s(world: int, metrics: Any, firsts: dict[int, float], attempt: int = 0) -> float | None:
    """Seconds since every rank of ``attempt`` made its first step (the latest "ts" of their first
    step records), or None before then; ``firsts`` keeps what was read already."""
    for r in range(world):
        if r not in firsts:
            first = next((x for x in records(metrics(r, attempt)) if isinstance(x.get("step"), int)), None)
            if first is None:
                return None
            firsts[r] = float(first["ts"])
    return time.time() - max(firsts.values())


def fault_words(a: argparse.Namespace) -> str:
    if a.fault_after_s is not None:
        first = f"{a.fault_after_s:g} s after every rank's first step"
    else:
        first = f"step >= {a.fault_step}"
    if a.second_fault_after_s is None:
        return first
    return f"{first}, then in attempt 1 {a.second_fault_after_s:g} s after every rank's first step"


def second_fault(
    trial: Trial, a: argparse.Namespace, proc: Any, metrics: Any, ours: Any, script: str, known: set[int]
) -> None:
    """Kill r1 of attempt 1 ``--second-fault-after-s`` after every rank of attempt 1 stepped: the
    measured fault from then on."""
    firsts: dict[int, float] = {}
    deadline = time.monotonic() + a.cap
    victim = None
    while True:
        if victim is None or not alive(victim):
            pids = marked(ours)
            known.update(pids)
            victim = rank_process(pids, 1, ours, script, attempt=1)
        trained = trained_s(trial.world, metrics, firsts, attempt=1)
        if trained is not None and trained >= a.second_fault_after_s:
            if victim is None:
                raise RuntimeError("r1 of attempt 1 due for its kill, but its process was not found")
            os.kill(victim, signal.SIGKILL)
            trial.t_kill, trial.kill_step, trial.measured = time.time(), last_step(metrics(1, 1)), 2
            return
        if proc.poll() is not None:
            raise RuntimeError(f"mscon exited {proc.returncode} before the second kill was due")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the second kill was not due within {a.cap:.0f} s")
        time.sleep(POLL_S)


def loss_lines(lines: list[tuple[float, str, str]]) -> list[tuple[float, int, int, int, str]]:
    """(t, rank, epoch, i, text) for every loss line on mscon's stdout."""
    out = []
    for t, src, text in lines:
        if src != "stdout" or (m := MSCON_LINE_RE.match(text)) is None:
            continue
        proc, body = m.group("proc"), m.group("text")
        if proc.startswith("r") and proc[1:].isdigit() and (x := LOSS_RE.match(body.strip())):
            out.append((t, int(proc[1:]), int(x.group(1)), int(x.group(2)), body.strip()))
    return out


def run_trial(trial: Trial, cluster: Any, a: argparse.Namespace, tmp: Path, data: Path, port: int) -> None:
    run_id = f"bench-user-restart-{os.getpid()}-{trial.index}"
    base = tmp / f"trial-{trial.index}"
    work = base / "work"
    work.mkdir(parents=True)
    script, source, _ = MODELS[a.model]
    if a.unmodified:
        (work / SCRIPT).write_text(stripped_net_py(), encoding="utf-8")
    else:
        shutil.copy(source, work / script)
    inv = base / "inv.yaml"
    write_inventory(inv, cluster, a.ranks_per_node, port, work, data, a)
    summary = base / "summary.json"
    cmd = [
        sys.executable, "-m", "mscon.console.cli", "run", "--no-tui", str(inv),
        "--logs-dir", str(base / layout.LOGS_DIR), "--run-id", run_id, "--json", str(summary),
        "--max-restarts", str(a.max_restarts),
    ]  # fmt: skip
    marker = f"/{run_id}/"

    def ours(env: dict[str, str]) -> bool:
        return marker in env.get("MSCON_METRICS", "")

    nodes = [n.name for n in cluster.nodes]
    node_of = {r: nodes[r // a.ranks_per_node] for r in range(trial.world)}

    def metrics(rank: int, attempt: int) -> Path:
        return Path(layout.metrics_path(NODE_RUNS / run_id / node_of[rank], attempt, f"r{rank}"))

    spe = a.samples // (trial.world * BATCH)
    known: set[int] = set()
    firsts: dict[int, float] = {}  # rank -> "ts" of its first step in attempt 0 (--fault-after-s)
    fault = fault_words(a)
    trial.t_start = time.time()
    proc = subprocess.Popen(
        cmd, cwd=base, env=bench_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    reader = Reader(proc)
    try:
        victim = None
        seen = 0
        deadline = time.monotonic() + a.timeout
        while trial.t_kill is None:
            if victim is None or not alive(victim):
                pids = marked(ours)
                known.update(pids)
                victim = rank_process(pids, 1, ours, script)
            step = None
            if a.unmodified:
                snap = reader.snapshot()
                for _, r, e, i, _ in loss_lines(snap[seen:]):
                    if r == 1:
                        step = max(step or 0, e * spe + i + 1)
                seen = len(snap)
            else:
                step = last_step(metrics(1, 0))
            if a.fault_after_s is not None:
                trained = trained_s(trial.world, metrics, firsts)
                due = trained is not None and trained >= a.fault_after_s
            else:
                due = step is not None and step >= a.fault_step
            if due:
                if victim is None:
                    raise RuntimeError(f"r1 due for its kill (step {step}), but its process was not found")
                os.kill(victim, signal.SIGKILL)
                trial.t_kill, trial.kill_step = time.time(), step
                if a.second_fault_after_s is not None:
                    second_fault(trial, a, proc, metrics, ours, script, known)
                break
            if proc.poll() is not None:
                raise RuntimeError(f"mscon exited {proc.returncode} before r1's kill was due ({fault})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"r1's kill ({fault}) was not due within {a.timeout:.0f} s")
            time.sleep(POLL_S)
        try:
            trial.rc = proc.wait(timeout=a.cap)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"mscon did not finish within {a.cap:.0f} s after the kill") from None
        reader.join()
        analyse(trial, a, reader.snapshot(), metrics, summary)
    finally:
        trial.wall = time.time() - trial.t_start
        _stop_launcher(proc, signal.SIGINT, 20.0)  # SIGINT: mscon stops the ranks on every node
        reader.join()
        trial.tail = [f"{src}: {x}" for _, src, x in reader.snapshot()[-40:]]
        leftovers = set(marked(ours)) | {p for p in known if alive(p)}
        leftovers.discard(os.getpid())
        _kill_marked(sorted(leftovers), f"trial {trial.index}")
        for node in nodes:
            for folder in layout.own_shm_snapshot_folders(str(NODE_RUNS / run_id / node)):
                shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(NODE_RUNS / run_id, ignore_errors=True)
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)


def analyse(trial: Trial, a: argparse.Namespace, lines: list, metrics: Any, summary: Path) -> None:
    assert trial.t_kill is not None
    kill = trial.t_kill
    m = trial.measured  # the attempt the measured fault restarted into; m - 1 is the faulted one
    spe = a.samples // (trial.world * BATCH)
    trial.restart_line = next(
        (t - kill for t, s, x in lines if s == "stderr" and t >= kill and x.startswith("mscon: restarting")),
        None,
    )
    split = kill + trial.restart_line if trial.restart_line is not None else kill
    printed: dict[int, tuple[set[tuple[int, int]], set[tuple[int, int]]]] = {
        r: (set(), set()) for r in range(trial.world)
    }
    for t, r, e, i, text in loss_lines(lines):
        printed.setdefault(r, (set(), set()))[t >= split].add((e, i))
        if t >= split and r not in trial.first_line:
            trial.first_line[r] = (t - kill, text)
    for r, (before, after) in printed.items():
        if both := sorted(before & after):
            trial.twice[r] = [f"epoch {e} step {i}" for e, i in both]
    for r in range(trial.world):
        if a.unmodified:
            steps0 = [e * spe + i + 1 for e, i in printed[r][0]]
            trial.last0[r] = max(steps0, default=0)
            if r in trial.first_line:
                trial.first_step[r] = trial.first_line[r][0]
        else:
            trial.last0[r] = last_step(metrics(r, m - 1))
            first0 = next((x for x in records(metrics(r, m - 1)) if isinstance(x.get("step"), int)), None)
            if first0 is not None:
                trial.trained0 = max(trial.trained0 or -1e9, kill - float(first0["ts"]))
            recs = records(metrics(r, m))
            first = next((x for x in recs if isinstance(x.get("step"), int)), None)
            if first is not None:
                trial.first_step[r] = float(first["ts"]) - kill
            res = next((x["resume"] for x in recs if isinstance(x.get("resume"), dict)), None)
            if res is not None:
                trial.resumed[r] = res
    if a.unmodified:
        trial.resumed = {r: {"step": 0, "source": "none (started over)"} for r in trial.first_line}
    try:
        doc = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {}
    attempts = doc.get("attempts") or []
    trial.outcomes = [str(x.get("outcome")) for x in attempts]
    if len(attempts) > m and isinstance(attempts[m].get("resume"), dict):
        trial.verdict = str(attempts[m]["resume"].get("verdict", ""))
    breakdowns = start_up(summary)
    trial.phases0 = next((text for n, text, _ in breakdowns if n == m - 1), "")
    trial.phases1 = next((text for n, text, _ in breakdowns if n == m), "")
    if m > 1:
        trial.phases_first = next((text for n, text, _ in breakdowns if n == 1), "")
    problems = []
    if trial.rc != 0:
        problems.append(f"mscon exited {trial.rc}")
    if trial.outcomes != ["failed"] * m + ["succeeded"]:
        problems.append(f"attempts {trial.outcomes}")
    if trial.all_first_step is None:
        problems.append(f"only ranks {sorted(trial.first_step)} stepped in attempt {m}")
    if not a.unmodified:
        srcs = {str(r.get("source")) for r in trial.resumed.values()}
        if trial.resume_step is None or srcs != {"snapshot"}:
            problems.append(f"resume records {trial.resumed}")
        elif trial.lost is not None and not 0 <= trial.lost <= 1:
            problems.append(
                f"{trial.lost} steps lost (last common {trial.last_common}, resumed {trial.resume_step})"
            )
    trial.error = "; ".join(problems)
    trial.ok = not problems


# ---------------------------------------------------------------- report


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def trial_line(t: Trial, a: argparse.Namespace) -> str:
    head = f"#{t.index}: "
    if t.t_kill is None:
        return head + f"FAILED before the kill: {t.error}"
    per_rank = " ".join(f"r{r}={v:.2f}" for r, v in sorted(t.first_step.items()))
    resumed = t.resume_step
    m = t.measured
    lines = [
        head + f"r1 killed at its step {t.kill_step}; attempt {m}: every rank at its first step "
        f"{_s(t.all_first_step)} s ({per_rank}); every rank's next loss line {_s(t.all_first_line)} s; "
        f"steps lost {t.lost if t.lost is not None else '-'} (last common step of attempt {m - 1} "
        f"{t.last_common}, resumed after {resumed if resumed is not None else t.resumed})",
        f"    attempt {m - 1} trained {_s(t.trained0)} s (every rank's first step -> kill; mscon's launch -> "
        f"kill {_s(t.t_kill - t.t_start)} s); "
        f"mscon 'restarting' at {_s(t.restart_line)} s; attempt {m} {'warm' if t.warm else 'NOT WARM'}: "
        f"{t.phases1 or '(no breakdown)'}",
        f"    attempt {m - 1}: {t.phases0 or '(no breakdown)'}",
        f"    summary: attempts {t.outcomes}, attempt {m}'s resume: {t.verdict or '-'}; "
        + ("OK" if t.ok else f"NOT OK: {t.error}"),
    ]
    if t.twice:
        lines.append(
            "    printed in both attempts: "
            + "; ".join(
                f"r{r}: {v[0]}" if len(v) == 1 else f"r{r}: {len(v)} lines, {v[0]} .. {v[-1]}"
                for r, v in sorted(t.twice.items())
            )
        )
    if t.shared:
        lines.append(
            f"    NOT ALONE: other jobs used {t.foreign_cpu:.1f} CPU-s, up to {t.foreign} MindSpore processes"
        )
    return "\n".join(lines)


def to_first_step(phases: str) -> float | None:
    """The seconds an attempt's start-up took, from mscon's breakdown of it ("...; 12.87 s to first step")."""
    m = re.search(r"([0-9.]+) s to first step", phases)
    return float(m.group(1)) if m else None


def stats(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "-"
    return (
        f"p50 {fmt.format(statistics.median(values))}, min {fmt.format(min(values))}, "
        f"max {fmt.format(max(values))} (n={len(values)})"
    )


def report(trials: list[Trial], a: argparse.Namespace) -> None:
    print()
    ok = [t for t in trials if t.t_kill is not None]
    m = 2 if a.second_fault_after_s is not None else 1  # the attempt the measured fault restarts into
    what = "net.py without mscon_resume (--unmodified)" if a.unmodified else "examples/net.py (mscon_resume)"
    if a.model == "resnet18":
        what = f"MindCV ResNet-18 (bench/mindcv_resnet.py, ResumeCallback; graph cache {a.graph_cache})"
    print(f"{what}: r1 SIGKILLed at {fault_words(a)}; seconds / steps from the kill:")
    rows = [
        (f"(a) every rank of attempt {m} at its first step", [t.all_first_step for t in ok], "{:.2f} s"),
        ("(b) every rank's next loss line on stdout", [t.all_first_line for t in ok], "{:.2f} s"),
        (
            "(c) steps lost" + (" (>=: lines every 10 steps)" if a.unmodified else ""),
            [t.lost for t in ok],
            "{:g}",
        ),
    ]
    for label, vals, fmt in rows:
        got = [float(v) for v in vals if v is not None]
        print(f"  {label:<52}{stats(got, fmt)}")
    restarting = [t.restart_line for t in ok if t.restart_line is not None]
    print(f"  mscon 'restarting' line after the kill: {stats(restarting, '{:.2f} s')}")
    print(f"  warm restarts: {sum(t.warm for t in ok)} of {len(ok)}")
    if a.second_fault_after_s is not None:
        first_warm = sum("(warm" in t.phases_first for t in ok)
        print(f"  (the measured restart is the second; the first was warm in {first_warm} of {len(ok)})")
    if not a.unmodified:
        trained = [t.trained0 for t in ok if t.trained0 is not None]
        print(f"  attempt {m - 1} trained (every rank's first step -> kill): {stats(trained, '{:.2f} s')}")
        launched = [t.t_kill - t.t_start for t in ok if t.t_kill is not None]
        print(f"  mscon's launch -> kill: {stats(launched, '{:.2f} s')}")
        first0 = [s for t in ok if (s := to_first_step(t.phases0)) is not None]
        what0 = "attempt 0 (cold)" if m == 1 else f"attempt {m - 1}"
        print(f"  {what0} to every rank's first step: {stats(first0, '{:.2f} s')}")
    twice = [t.index for t in ok if t.twice]
    print(f"  trials with a loss line printed in both attempts: {twice or 'none'}")
    shared = [t.index for t in trials if t.shared]
    if shared:
        print(f"WARNING: other jobs used the machine during trial(s) {shared}: those timings may be inflated")
    failed = [t.index for t in trials if not t.ok]
    print(f"trials: {len(trials)}, not OK: {len(failed)}" + (f" ({failed})" if failed else ""))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (e.g. `timeout`): clean up like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="trials")
    p.add_argument("--fault-step", type=int, default=150, help="kill r1 once its step is >= this")
    p.add_argument(
        "--fault-after-s",
        type=float,
        help="kill r1 this many seconds after every rank's first step instead (an early fault: 1)",
    )
    p.add_argument(
        "--second-fault-after-s",
        type=float,
        help="then kill r1 of attempt 1 this many s after its every rank's first step (measured; budget 2)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=1,
        help="mscon's budget (one fault either way; 2: attempt 1 prepares spares of its own)",
    )
    p.add_argument("--unmodified", action="store_true", help="net.py without its three mscon_resume lines")
    p.add_argument("--model", choices=sorted(MODELS), default="net", help="the job's script (see above)")
    p.add_argument("--graph-cache", choices=("auto", "on", "off"), default="auto", help="MSCON_GRAPH_CACHE")
    p.add_argument(
        "--samples",
        type=int,
        help="net: fake MNIST samples (2560: 20 steps an epoch); resnet18: a rank's (160)",
    )
    p.add_argument("--epochs", type=int, default=4, help="resnet18: epochs")
    p.add_argument("--image", type=int, default=32, help="resnet18: the synthetic images' side")
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--timeout", type=float, default=400.0, help="s from the start to the fault step, at most")
    p.add_argument("--cap", type=float, default=400.0, help="s from the kill until mscon finished, at most")
    p.add_argument("--max-wait-idle", type=float, default=120.0, help="wait up to this long for idle")
    p.add_argument("--dump", action="store_true", help="print mscon's last lines after every trial")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (inventories, outputs)")
    a = p.parse_args(argv)
    nodes = 2
    world = nodes * a.ranks_per_node
    if world > 4:
        p.error("at most 4 MindSpore ranks at once on this machine")
    if a.repeat < 1:
        p.error("--repeat must be >= 1")
    if problem := ENV.problem("mscon"):
        p.error(problem)
    if a.samples is None:
        a.samples = 160 if a.model == "resnet18" else 2560
    if a.model == "resnet18":
        if a.unmodified:
            p.error("--unmodified is net.py's")
        spe, epochs = a.samples // MODELS[a.model][2], a.epochs
    else:
        spe, epochs = a.samples // (world * BATCH), 10
    if spe < 1 or not 0 < a.fault_step < epochs * spe:
        p.error(f"--fault-step must be within the script's {epochs} epochs of {spe} steps")
    if a.fault_after_s is not None and (a.unmodified or a.fault_after_s < 0):
        p.error("--fault-after-s needs the ranks' step records (not --unmodified) and is >= 0")
    if a.second_fault_after_s is not None and (
        a.unmodified or a.second_fault_after_s < 0 or a.max_restarts < 2
    ):
        p.error("--second-fault-after-s: >= 0, with step records (not --unmodified), --max-restarts 2")
    if a.unmodified:
        stripped_net_py()  # fails early if net.py's lines changed
    exe = Path(sys.executable)
    exe_s = str(exe.relative_to(REPO)) if exe.is_relative_to(REPO) else str(exe)
    pp = os.environ.get("PYTHONPATH")
    print(
        "user-restart benchmark: "
        + (f"PYTHONPATH={shlex.quote(pp)} " if pp else "")
        + shlex.join([exe_s, *sys.argv])
        + f"   # in {os.getcwd()}"
    )
    print(
        f"{nodes} sshd nodes x {a.ranks_per_node} ranks (world {world}) on loopback; "
        f"mscon run --no-tui INV --max-restarts {a.max_restarts}, job.script {MODELS[a.model][0]}"
        + (" (stripped of mscon_resume)" if a.unmodified else f" ({MODELS[a.model][1].relative_to(REPO)})")
        + f", MSCON_GRAPH_CACHE={a.graph_cache}"
    )
    if a.model == "resnet18":
        print(
            f"data: synthetic {a.image}x{a.image} images, {a.samples} a rank: {spe} steps an epoch, "
            f"{epochs * spe} in all"
        )
    else:
        print(f"data: bench/fake_mnist.py, {a.samples} samples: {spe} steps an epoch, {10 * spe} in all")
    tmp = Path(tempfile.mkdtemp(prefix="mscon-bench-user-restart-"))
    cluster = None
    trials: list[Trial] = []
    watch = Contention()
    watch.start()
    try:
        data = write_fake_mnist(tmp / "mnist", a.samples if a.model == "net" else 1)
        cluster = sshd_nodes().start_sshd_cluster(tmp / "sshd", n=nodes)
        print(f"sshd nodes: {', '.join(f'{n.host}:{n.port}' for n in cluster.nodes)}", flush=True)
        for i in range(1, a.repeat + 1):
            wait_idle(watch, a.max_wait_idle)
            hosts = ["127.0.0.1", *(f"127.0.0.{k + 2}" for k in range(nodes))]
            port = sshd_nodes().find_free_port(hosts)
            watch.reset(port)
            trial = Trial(i, world)
            trials.append(trial)
            try:
                run_trial(trial, cluster, a, tmp, data, port)
            except (RuntimeError, OSError) as exc:
                trial.error = str(exc)
                trial.ok = False
            watch.sample()
            trial.foreign, trial.foreign_cpu = watch.peak, watch.cpu
            print(trial_line(trial, a), flush=True)
            if a.dump or (not trial.ok and trial.tail):
                print("  mscon's last lines:\n" + "\n".join(f"    {x[:220]}" for x in trial.tail))
    except KeyboardInterrupt:
        print("interrupted; partial results:")
    finally:
        end_bench(watch, cluster, tmp, a.keep)
    report(trials, a)
    return 0 if trials and all(t.ok for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
