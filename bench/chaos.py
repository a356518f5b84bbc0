"""Time lost, measured: the trainer under a rank killed at random every minute, mscon vs msrun.

trainer/train.py --parallel-mode data_parallel over NODES sshd nodes x RANKS ranks on loopback (the
topology of bench/launch.py and bench/failstop.py) for --duration seconds. Every --every seconds a
rank drawn at random (``random.Random(--seed)``: every variant gets the same victims) is killed with
SIGKILL, once every rank of the attempt then running has stepped (a fault due while the job is
still recovering waits for that; it is never dropped). Variants:

* ``warm``: mscon as it is by default (the policy restarts at once after a fault in training, on the
  standby cluster the agents' spares joined during the attempt when every node's is ready), with
  what the trainer and MindSpore offer for a fast restart *when this bench runs*: the trainer's
  in-memory snapshot every step (``--snapshot-every 1``, if the trainer has the flag); with
  --compile-cache also MindSpore's compile cache (``MS_COMPILER_CACHE_ENABLE``/``MS_COMPILER_CACHE_PATH``
  in job.env, one folder per run). Off by default: with it, every restarted rank failed in the
  trainer's resume AllReduce (``RuntimeError: Parameter[1] has no default param``, MindSpore 2.10 CPU);
* ``cold``: mscon with no spares (``--no-spares``: no standby cluster, every restart a cold
  launch), no compile cache, ``restart.backoff_s: 2`` (the old default; the policy waits it only
  after a failure before any step, so "cold" has none after a fault in training either). mscon
  still passes the trainer ``--snapshot-every 1`` (it does whenever a restart may come), so the
  steps lost are the same as warm's; the difference is the restart itself;
* ``msrun``: msrun does not restart: the bench reports what it does after the first fault (exits,
  or hangs until the end of the duration) and injects no more.

mscon runs with ``--max-restarts`` above the number of faults. Per variant, from the ranks' own
step reports (mscon: each attempt's MSCON_METRICS files in the node run folders; msrun: the step
lines of its worker logs, polled every 10 ms) and the fault times, bench/chaos_math.py computes:
effective training time ratio (time on steps that count / wall), steps lost per fault (last step
reached before it minus the step the next attempt resumed at) and recovery time per fault (fault ->
every rank of the next attempt at its first step), p50/p95. Needs root (sshd) and a Python with
mscon, msrun and MindSpore; with the live source:

    PYTHONPATH=.dev .venv/bin/python bench/chaos.py [--duration 600] [--every 60] [--variants warm,cold,msrun]

``--net-py``: the same on a user's own script instead of the trainer: MindSpore's msrun sample
examples/net.py with mscon_resume's three lines (docs/resume.md), over bench/fake_mnist.py's data
(``--net-samples``; by default enough that net.py's 10 epochs outlast --duration at
``--net-step-s`` a step), copied into a workdir of the bench's. Its step records come from the
library (MSCON_METRICS, a snapshot every step by default); under msrun from its loss lines (every
10th step: ``epoch: E, step: I`` is global step E x steps-an-epoch + I + 1). ``cold`` is then
``--no-spares`` and ``restart.backoff_s: 2``, and msrun runs it as the docs do (no MSCON_RESUME):

    .venv/bin/python bench/chaos.py --net-py [--duration 600] [--every 60] [--variants warm,msrun]

Everything a variant starts is removed when it ends, also on Ctrl-C and SIGTERM: the launchers'
process groups, any process carrying the run's markers, the node-side run folders, the trainer's
snapshot folders (/dev/shm) and msrun's log folder (--net-py: also the library's /dev/shm folders).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from chaos_math import (  # bench/ is on sys.path when run as a script
    Attempt,
    Fault,
    FaultCost,
    StepMark,
    attempts,
    effective_ratio,
    fault_costs,
    percentile,
    training_seconds,
)
from failstop import (
    STEP_RE,
    Lines,
    LogPoller,
    _kill_marked,
    _stop_launcher,
    alive,
    cmdline,
    marked,
    proc_environ,
    proc_stat,
    runs_script,
    write_inventory,
)
from fake_mnist import write_fake_mnist
from launch import MSRUN_REMOTE, Contention, bench_env, end_bench, start_msrun_node, wait_idle
from launch import PYTHON as LAUNCH_PYTHON
from procstat import layout, node_runs, sshd_nodes, tool_env

REPO = Path(__file__).resolve().parent.parent
ENV = tool_env("msrun")
SCRIPT = "trainer/train.py"
NODE_RUNS = node_runs("root")  # where the sshd nodes' agents (user root) keep a run's files
VARIANTS = ("warm", "cold", "msrun")
POLL_S = 0.05
SPARE_BOOT = "spare_boot.py"  # agent/spares.py: a spare rank runs this file, then becomes the rank
STEPS_PER_EPOCH = 500
RANK_FILE_RE = re.compile(r"^r(\d+)" + re.escape(layout.METRICS_SUFFIX) + "$")
WORKER_LOG_RE = re.compile(r"(?:^|/)worker_(\d+)\.log$")
# --net-py: the docs' sample with mscon_resume (its batch and epochs are fixed in the script)
NET_SCRIPT = "net.py"
NET_EXAMPLE = REPO / "examples" / NET_SCRIPT
NET_BATCH = 32
NET_EPOCHS = 10
NET_LOSS_RE = re.compile(r"epoch: ?(\d+),? step: ?(\d+), loss is")
COLD_NOTE = (
    "cold: restart.backoff_s 2, but the policy waits it only after a failure before any step "
    "(agent/policy.py); no setting brings back the old wait after a fault in training"
)


def trainer_module(name: str) -> Any:
    """``trainer.<name>`` of this checkout (bench/trainer.py would shadow the package from bench/)."""
    sys.path.insert(0, str(REPO))
    try:
        return importlib.import_module(f"trainer.{name}")
    finally:
        sys.path.remove(str(REPO))


def trainer_flags() -> set[str]:
    """The flags the trainer has today (its own parser)."""
    parser = trainer_module("config").build_parser()
    return {s for act in parser._actions for s in act.option_strings}


# ---------------------------------------------------------------- step reports


class MetricsTail:
    """Reads the step records of every rank's MSCON_METRICS file under a run's node folders, as they
    grow (``<run>/<node>/attempt_<N>/r<rank>.metrics.jsonl``, agent/layout.py)."""

    def __init__(self, run_root: Path) -> None:
        self.run_root = run_root
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}
        self.marks: list[StepMark] = []

    def poll(self) -> None:
        for path in sorted(self.run_root.glob(f"*/{layout.ATTEMPT_PREFIX}*/r*{layout.METRICS_SUFFIX}")):
            m = RANK_FILE_RE.match(path.name)
            attempt = path.parent.name[len(layout.ATTEMPT_PREFIX) :]
            if m is None or not attempt.isdigit():
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    data = self.partial.get(path, b"") + f.read()
                    self.offsets[path] = f.tell()
            except OSError:
                continue
            lines = data.split(b"\n")
            self.partial[path] = lines.pop()
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("step"), int) and "ts" in rec:
                    self.marks.append(StepMark(int(attempt), int(m.group(1)), rec["step"], float(rec["ts"])))


class StepLines:
    """Step marks from msrun's worker logs (``worker_<rank>.log``: epoch and in-epoch step)."""

    def __init__(self, lines: Lines, steps_per_epoch: int) -> None:
        self.lines, self.spe = lines, steps_per_epoch
        self.seen = 0
        self.marks: list[StepMark] = []
        self.wall_offset = time.time() - time.monotonic()  # the poller stamps lines on the monotonic clock

    def poll(self) -> None:
        snap = self.lines.snapshot()
        for t, src, text in snap[self.seen :]:
            w, s = WORKER_LOG_RE.search(src), STEP_RE.search(text)
            if w and s:
                step = (int(s.group(1)) - 1) * self.spe + int(s.group(2))
                self.marks.append(StepMark(0, int(w.group(1)), step, t + self.wall_offset))
        self.seen = len(snap)


class NetStepLines(StepLines):
    """--net-py under msrun: net.py's loss lines (0-based epoch and in-epoch index, every 10th step)."""

    def poll(self) -> None:
        snap = self.lines.snapshot()
        for t, src, text in snap[self.seen :]:
            w, s = WORKER_LOG_RE.search(src), NET_LOSS_RE.search(text)
            if w and s:
                step = int(s.group(1)) * self.spe + int(s.group(2)) + 1
                self.marks.append(StepMark(0, int(w.group(1)), step, t + self.wall_offset))
        self.seen = len(snap)


def training(marks: list[StepMark], attempt: int, world: int) -> bool:
    """Every rank of ``attempt`` has stepped."""
    return len({m.rank for m in marks if m.attempt == attempt}) >= world


# ---------------------------------------------------------------- one variant


@dataclass
class Result:
    variant: str
    world: int
    settings: list[str] = field(default_factory=list)
    t_start: float = 0.0  # wall clock
    wall_s: float = 0.0
    marks: list[StepMark] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    outcome: str = ""  # how the run ended
    error: str = ""
    foreign: int = 0
    foreign_cpu: float = 0.0

    @property
    def runs(self) -> dict[int, Attempt]:
        return attempts(self.marks, self.world)

    @property
    def costs(self) -> list[FaultCost]:
        return fault_costs(self.runs, self.faults)

    @property
    def ratio(self) -> float:
        return effective_ratio(self.runs, self.wall_s)

    @property
    def shared(self) -> bool:
        return bool(self.foreign) or self.foreign_cpu > max(1.0, 0.05 * self.wall_s)

    def raw(self) -> dict[str, Any]:
        t0 = self.t_start
        return {
            "settings": self.settings,
            "wall_s": round(self.wall_s, 3),
            "training_s": round(training_seconds(self.runs), 3),
            "effective_ratio": round(self.ratio, 4),
            "outcome": self.outcome,
            "error": self.error,
            "attempts": [
                {
                    "attempt": a.number,
                    "resumed_at": a.resumed_at,
                    "last_step": a.last,
                    "first_step_all_s": None if a.first_step_all is None else round(a.first_step_all - t0, 3),
                }
                for a in self.runs.values()
            ],
            "faults": [
                {
                    "t_s": round(c.fault.ts - t0, 3),
                    "rank": c.fault.rank,
                    "attempt": c.fault.attempt,
                    "last_step": c.last_step,
                    "resumed_at": c.resumed_at,
                    "steps_lost": c.steps_lost,
                    "recovery_s": None if c.recovery_s is None else round(c.recovery_s, 3),
                }
                for c in self.costs
            ],
            "other_jobs": {"mindspore_processes": self.foreign, "cpu_s": round(self.foreign_cpu, 1)},
        }


def rank_process(
    pids: list[int], rank: int, env_ok: Any, scripts: tuple[str, ...] = ()
) -> tuple[int | None, list[int]]:
    """The rank's own process (RANK_ID=rank, MS_ROLE=MS_WORKER, ``env_ok``, running the script or
    a spare that became the rank: agent/spares.py; its /proc cmdline stays the spare's): the one
    whose parent is none of them (a process it forked carries its environment and command line
    too); also every candidate, to say why when there is no single one. ``scripts``: other
    script names a rank may run (--net-py: net.py)."""
    cands = [
        p
        for p in pids
        if (e := proc_environ(p)).get("RANK_ID") == str(rank)
        and e.get("MS_ROLE") == "MS_WORKER"
        and env_ok(e)
        and (runs_script(p) or any(w.endswith((SPARE_BOOT, *scripts)) for w in cmdline(p)))
    ]
    roots = [p for p in cands if (st := proc_stat(p)) is not None and st[1] not in cands]
    return (roots[0] if len(roots) == 1 else None), cands


class Injector:
    """The fault schedule: the k-th fault is due at start + k x every, and goes in once every rank
    of the attempt running then has stepped; the victim's rank comes from the seeded draw."""

    def __init__(self, a: argparse.Namespace, world: int, t_start: float) -> None:
        self.rng = random.Random(a.seed)
        self.world, self.every = world, a.every
        self.due = t_start + a.every
        self.rank: int | None = None  # drawn, not yet killed (its process was not found yet)
        self.hit: set[int] = set()  # attempts already faulted
        self.missed_since: float | None = None  # the drawn rank's process not found since
        self.scripts: tuple[str, ...] = (NET_SCRIPT,) if getattr(a, "net_py", False) else ()

    def try_inject(self, marks: list[StepMark], ours: Any, attempt_of: Any) -> Fault | None:
        if time.time() < self.due or not marks:
            return None
        cur = max(m.attempt for m in marks)
        if cur in self.hit or not training(marks, cur, self.world):
            return None
        if self.rank is None:
            self.rank = self.rng.randrange(self.world)
        victim, cands = rank_process(
            marked(ours), self.rank, lambda e: ours(e) and attempt_of(e) == cur, self.scripts
        )
        if victim is None:
            now = time.time()
            self.missed_since = self.missed_since or now
            if now - self.missed_since > 5.0:  # say why no fault goes in, once
                print(f"  r{self.rank} of attempt {cur}: no single process among {cands}", flush=True)
                self.missed_since = math.inf
            return None
        self.missed_since = None
        os.kill(victim, signal.SIGKILL)
        fault = Fault(time.time(), self.rank, cur)
        self.hit.add(cur)
        self.rank = None
        self.due += self.every
        return fault


def train_args(a: argparse.Namespace, extra: list[str]) -> list[str]:
    epochs = math.ceil(a.duration / max(a.step_sleep, 0.01) / STEPS_PER_EPOCH) + 2  # never done in time
    return [
        "--parallel-mode", "data_parallel", "--epochs", str(epochs),
        "--steps-per-epoch", str(STEPS_PER_EPOCH), "--step-sleep", str(a.step_sleep),
        "--checkpoint-every", str(a.checkpoint_every), *extra,
    ]  # fmt: skip


def run_mscon(res: Result, cluster: Any, a: argparse.Namespace, tmp: Path, port: int) -> None:
    run_id = f"bench-chaos-{os.getpid()}-{res.variant}"
    inv = tmp / f"{run_id}.yaml"
    write_inventory(inv, cluster, a.ranks_per_node, port, "bench-chaos")
    doc = yaml.safe_load(inv.read_text(encoding="utf-8"))
    flags = trainer_flags()
    extra: list[str] = []
    launcher_flags: list[str] = []
    if res.variant == "warm":
        res.settings.append("restart at once after a fault in training (policy default)")
        if a.net_py:
            res.settings.append("examples/net.py: mscon_resume's snapshot every step (every='auto')")
        elif "--snapshot-every" in flags:
            extra += ["--snapshot-every", "1"]
            res.settings.append("trainer --snapshot-every 1")
        else:
            res.settings.append("no in-memory snapshot (the trainer has no --snapshot-every)")
        if a.compile_cache:
            cache = tmp / f"{run_id}-compile-cache"
            doc["job"]["env"].update({"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(cache)})
            res.settings.append("MS_COMPILER_CACHE_ENABLE=1 (one folder per run)")
        else:
            res.settings.append(
                "MindSpore compile cache off (--compile-cache: on; it broke the resume when tried)"
            )
        res.settings.append("spares joined to a standby cluster (restart.standby: auto, joined on CPU)")
    else:
        doc["restart"] = {"backoff_s": 2}
        launcher_flags.append("--no-spares")
        res.settings += [
            "no spares (--no-spares), no compile cache; "
            + ("mscon_resume snapshots as in warm" if a.net_py else "mscon still passes --snapshot-every 1"),
            COLD_NOTE,
        ]
    if a.net_py:
        doc["job"].update(workdir=str(a.net_work), script=NET_SCRIPT)
        doc["job"]["env"]["DATA_PATH"] = str(a.net_data)
    inv.write_text(yaml.safe_dump(doc), encoding="utf-8")
    max_restarts = min(1000, math.ceil(a.duration / a.every) + 2)
    args = train_args(a, extra)
    cmd = [
        sys.executable, "-m", "mscon.console.cli", "run", "--no-tui", "-q", str(inv),
        "--logs-dir", str(tmp / layout.LOGS_DIR), "--run-id", run_id, "--json", str(tmp / f"{run_id}.json"),
        "--max-restarts", str(max_restarts), *launcher_flags, "--", SCRIPT, *args,
    ]  # fmt: skip
    shown = " ".join([f"--max-restarts {max_restarts}", *launcher_flags])
    if a.net_py:  # the inventory's job.script, no arguments
        cmd = cmd[: cmd.index("--")]
        res.settings.append(f"mscon run {shown} INV (job.script {NET_SCRIPT}: {net_data_note(a)})")
    else:
        res.settings.append(f"mscon run {shown} -- {SCRIPT} {' '.join(args)}")
    marker = f"/{run_id}/"

    def ours(env: dict[str, str]) -> bool:
        return marker in env.get("MSCON_METRICS", "")

    def attempt_of(env: dict[str, str]) -> int:
        return int(env.get("MSCON_ATTEMPT", "0"))

    tail = MetricsTail(NODE_RUNS / run_id)
    known: set[int] = set()
    ckpt_dirs: set[str] = set()
    out = open(tmp / f"{run_id}.out", "wb")  # noqa: SIM115 - closed in finally
    res.t_start = time.time()
    proc = subprocess.Popen(
        cmd, cwd=tmp, env=bench_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    inject = Injector(a, res.world, res.t_start)
    try:
        end = res.t_start + a.duration
        while time.time() < end:
            if proc.poll() is not None:
                res.outcome = f"mscon exited {proc.returncode} after {time.time() - res.t_start:.1f} s"
                break
            tail.poll()
            fault = inject.try_inject(tail.marks, ours, attempt_of)
            if fault is not None:
                res.faults.append(fault)
                print(f"  {res.variant}: fault {len(res.faults)} at {fault.ts - res.t_start:6.1f} s: "
                      f"SIGKILL r{fault.rank} of attempt {fault.attempt}", flush=True)  # fmt: skip
            if fault is not None or len(known) < res.world:
                for pid in marked(ours):  # where the trainer keeps its snapshots: for the cleanup
                    known.add(pid)
                    words = cmdline(pid)
                    if "--checkpoint-dir" in words[:-1]:
                        ckpt_dirs.add(words[words.index("--checkpoint-dir") + 1])
            time.sleep(POLL_S)
        else:
            res.outcome = f"still training at the end of the {a.duration:.0f} s; stopped by the bench"
        res.wall_s = a.duration  # a run that ended early was down for the rest of it
    finally:
        _stop_launcher(proc, signal.SIGINT, 30.0)  # SIGINT: mscon stops the ranks on every node
        out.close()
        tail.poll()
        res.marks = [m for m in tail.marks if m.ts <= res.t_start + a.duration]
        _kill_marked(sorted(set(marked(ours)) | {p for p in known if alive(p)}), f"mscon {res.variant}")
        _remove_snapshots(ckpt_dirs)
        if a.net_py:  # mscon_resume's folders in /dev/shm (the agents remove them at a normal end)
            for node in cluster.nodes:
                for folder in layout.own_shm_snapshot_folders(str(NODE_RUNS / run_id / node.name)):
                    shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(NODE_RUNS / run_id, ignore_errors=True)
        if res.wall_s == 0.0:
            res.wall_s = time.time() - res.t_start
        if not res.outcome:
            res.error = "interrupted"
        if res.outcome.startswith("mscon exited"):
            res.error = res.outcome
            print(f"  last lines of mscon:\n{_tail(tmp / f'{run_id}.out', 30)}")


def _remove_snapshots(ckpt_dirs: set[str]) -> None:
    """The trainer's snapshot folders of the run (it removes them itself only when it finishes)."""
    if not ckpt_dirs:
        return
    try:
        snapshot = trainer_module("snapshot")
    except ImportError:  # a trainer without snapshots: nothing to remove
        return
    for ckpt in ckpt_dirs:
        for folder in snapshot.candidate_dirs(None, ckpt):
            shutil.rmtree(folder, ignore_errors=True)


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no output)"


def run_msrun(res: Result, a: argparse.Namespace, tmp: Path, port: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="msrun-chaos-", dir=tmp))
    args = train_args(a, [])
    work = base / "work"  # --net-py: msrun's own copy of the script (its .mscon-state goes there)
    if a.net_py:
        work.mkdir()
        shutil.copy(NET_EXAMPLE, work / NET_SCRIPT)
        res.settings.append(
            f"msrun --join=True {NET_SCRIPT} (no restart nor MSCON_RESUME; {net_data_note(a)})"
        )
    else:
        res.settings.append(f"msrun --join=True {SCRIPT} {' '.join(args)} (no restart)")
    lines = Lines()
    poller = LogPoller(base, lines)
    steps = NetStepLines(lines, net_steps_per_epoch(a)) if a.net_py else StepLines(lines, STEPS_PER_EPOCH)
    procs: list[subprocess.Popen[bytes]] = []
    outs = []
    needle = str(port)

    def ours(env: dict[str, str]) -> bool:
        return env.get("MS_SCHED_PORT") == needle

    known: set[int] = set()
    res.t_start = time.time()
    inject = Injector(a, res.world, res.t_start)
    try:
        for node in range(a.nodes):
            if a.net_py:
                proc, out = start_msrun_net_node(base, node, a, port, work)
            else:
                proc, out = start_msrun_node(base, node, a.nodes, a.ranks_per_node, port, args)
            procs.append(proc)
            outs.append(out)  # closed in finally
        poller.start()
        end = res.t_start + a.duration
        while time.time() < end:
            steps.poll()
            if not res.faults:
                fault = inject.try_inject(steps.marks, ours, lambda _env: 0)
                if fault is not None:
                    res.faults.append(fault)
                    known.update(marked(ours))
                    print(f"  msrun: fault at {fault.ts - res.t_start:6.1f} s: SIGKILL r{fault.rank}; "
                          "msrun does not restart: no more faults", flush=True)  # fmt: skip
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(POLL_S)
        now = time.time()
        res.wall_s = a.duration  # msrun ended at the fault: the job was down for the rest of it
        rcs = [p.poll() for p in procs]
        since = "" if not res.faults else f" {now - res.faults[0].ts:.1f} s after the fault"
        if all(rc is not None for rc in rcs):
            res.outcome = f"msrun exited (rc {rcs}){since}"
        elif res.faults:
            res.outcome = (
                f"msrun hung: still running{since}, at the end of the duration; stopped by the bench"
            )
        else:
            res.outcome = "no fault injected (the ranks never all stepped)"
    finally:
        for p in procs:
            _stop_launcher(p, signal.SIGINT, 10.0)  # msrun's SIGINT handler kills its workers
        poller.stop.set()
        if poller.is_alive():
            poller.join(timeout=5)
        steps.poll()
        res.marks = [m for m in steps.marks if m.ts <= res.t_start + a.duration]
        for out in outs:
            out.close()
        _kill_marked(sorted(set(marked(ours)) | {p for p in known if alive(p)}), "msrun")
        if a.net_py:
            _remove_net_state(work)
        shutil.rmtree(base, ignore_errors=True)
        if res.wall_s == 0.0:
            res.wall_s = time.time() - res.t_start
        if not res.outcome:
            res.error = "interrupted"


# ---------------------------------------------------------------- --net-py


def net_steps_per_epoch(a: argparse.Namespace) -> int:
    return a.net_samples // (a.nodes * a.ranks_per_node * NET_BATCH)


def net_data_note(a: argparse.Namespace) -> str:
    spe = net_steps_per_epoch(a)
    return f"{a.net_samples} fake MNIST samples, {spe} steps an epoch, {NET_EPOCHS * spe} in all"


def write_net_data(folder: Path, samples: int) -> Path:
    """bench/fake_mnist.py's data set of ``samples``: its first 10240 samples (at most) repeated,
    written piecewise (the whole array at once would take GBs for a 10-minute run)."""
    base = write_fake_mnist(folder / "base", min(samples, 10240))
    folder.mkdir(parents=True, exist_ok=True)
    for name, per in (("train-images-idx3-ubyte", 28 * 28), ("train-labels-idx1-ubyte", 1)):
        raw = (base / name).read_bytes()
        head = 4 + 4 * (3 if per > 1 else 1)
        body = raw[head:]
        with open(folder / name, "wb") as f:
            f.write(raw[:4] + struct.pack(">I", samples) + raw[8:head])
            left = samples
            while left > 0:
                n = min(left, len(body) // per)
                f.write(body[: n * per])
                left -= n
    shutil.rmtree(base, ignore_errors=True)
    return folder


def start_msrun_net_node(
    base: Path, node: int, a: argparse.Namespace, port: int, work: Path
) -> tuple[subprocess.Popen[bytes], Any]:
    """launch.start_msrun_node for net.py: run in ``work``, DATA_PATH set, no mscon variables."""
    log_dir = base / f"node{node}"
    log_dir.mkdir(parents=True)
    out = open(base / f"msrun-node{node}.out", "wb")  # noqa: SIM115 - the caller closes it
    launcher = [str(ENV.bin / "msrun")] if node == 0 else [str(LAUNCH_PYTHON), "-c", MSRUN_REMOTE]
    cmd = [
        *launcher, f"--worker_num={a.nodes * a.ranks_per_node}", f"--local_worker_num={a.ranks_per_node}",
        "--master_addr=127.0.0.1", f"--master_port={port}", f"--node_rank={node}", f"--log_dir={log_dir}",
        "--join=True", NET_SCRIPT,
    ]  # fmt: skip
    env = {k: v for k, v in bench_env().items() if not k.startswith("MSCON_")}
    env["DATA_PATH"] = str(a.net_data)
    proc = subprocess.Popen(
        cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    return proc, out


def _remove_net_state(work: Path) -> None:
    """What mscon_resume left under plain msrun: its /dev/shm folder for ``work/.mscon-state``."""
    try:
        from mscon_resume import store
    except ImportError:
        return
    first = store.shm_folder(str(work / ".mscon-state"))
    for folder in [first, *(f"{first}.{i}" for i in range(1, 8))]:
        if os.path.isdir(folder) and os.stat(folder).st_uid == os.getuid():
            shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- report


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def report(results: list[Result], a: argparse.Namespace) -> None:
    print()
    print(f"chaos: {a.nodes} nodes x {a.ranks_per_node} ranks, {a.duration:.0f} s, a rank killed every "
          f"{a.every:.0f} s (seed {a.seed})")  # fmt: skip
    head = ("variant", "faults", "effective ratio", "steps lost med/max", "recovery p50", "recovery p95")
    print(f"{head[0]:<8}{head[1]:>8}{head[2]:>17}{head[3]:>20}{head[4]:>15}{head[5]:>15}")
    for r in results:
        costs = r.costs
        lost = [c.steps_lost for c in costs if c.steps_lost is not None]
        rec = [c.recovery_s for c in costs if c.recovery_s is not None]
        lost_s = "-" if not lost else f"{percentile(lost, 50):g}/{max(lost)}"
        p50, p95 = percentile(rec, 50), percentile(rec, 95)
        print(f"{r.variant:<8}{len(r.faults):>8}{r.ratio:>16.1%} {lost_s:>20}{_s(p50):>15}{_s(p95):>15}")
    print("(ratio: time on steps that count / wall; recovery: seconds from the fault to every rank of")
    print(" the next attempt at its first step; steps lost: last step reached before the fault minus")
    print(" the step the next attempt resumed at)")
    for r in results:
        print(f"{r.variant}: {r.outcome or r.error}")
        for s in r.settings:
            print(f"  {s}")
        for c in r.costs:
            print(
                f"  fault at {c.fault.ts - r.t_start:6.1f} s (r{c.fault.rank}, attempt {c.fault.attempt}): "
                f"last step {c.last_step}, resumed at {c.resumed_at}, lost {c.steps_lost}, "
                f"recovery {_s(c.recovery_s)} s"
            )
        unrecovered = sum(1 for c in r.costs if c.recovery_s is None)
        if unrecovered and r.variant != "msrun":
            print(f"  {unrecovered} fault(s) not recovered before the end (not in the recovery figures)")
        if r.shared:
            print(
                f"  WARNING: other jobs used {r.foreign_cpu:.1f} CPU-s (up to {r.foreign} MindSpore "
                "processes) meanwhile: these figures are inflated"
            )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (e.g. `timeout`): clean up like Ctrl-C


def parse_variants(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {bad}; choose from {','.join(VARIANTS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds per variant")
    p.add_argument("--every", type=float, default=60.0, help="a fault every this many seconds")
    p.add_argument("--seed", type=int, default=1, help="seeds the victims' draw (the same in every variant)")
    p.add_argument("--variants", type=parse_variants, default=list(VARIANTS), help="comma-separated")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--step-sleep", type=float, default=0.05, help="the trainer's --step-sleep")
    p.add_argument("--checkpoint-every", type=int, default=10, help="the trainer's --checkpoint-every")
    p.add_argument("--compile-cache", action="store_true",
                   help="warm: MindSpore's compile cache on (it broke the trainer's resume)")  # fmt: skip
    p.add_argument(
        "--max-wait-idle", type=float, default=30.0, help="wait up to this long for an idle machine"
    )
    p.add_argument(
        "--net-py", action="store_true", help="examples/net.py with mscon_resume instead of the trainer"
    )
    p.add_argument("--net-samples", type=int, default=0, help="--net-py: fake MNIST samples (0: enough)")
    p.add_argument(
        "--net-step-s", type=float, default=0.006,
        help="--net-py: the step time (s) the default --net-samples assumes, with a 1.5x margin",
    )  # fmt: skip
    p.add_argument("--json", type=Path, help="also write the JSON line of raw numbers here")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (inventories, outputs)")
    a = p.parse_args(argv)
    world = a.nodes * a.ranks_per_node
    if world > 4:
        p.error("at most 4 MindSpore ranks at once on this machine")
    if a.duration <= 0 or a.every <= 0:
        p.error("--duration and --every must be > 0")
    if a.checkpoint_every < 1:
        p.error("--checkpoint-every must be >= 1")
    if "msrun" in a.variants and (problem := ENV.problem("msrun")):
        p.error(problem)
    if a.net_py and a.net_samples <= 0:  # net.py's 10 epochs outlast the duration
        per_epoch = math.ceil(1.5 * a.duration / a.net_step_s / NET_EPOCHS)
        a.net_samples = per_epoch * world * NET_BATCH
    command = shlex.join([sys.executable, *sys.argv])
    pp = os.environ.get("PYTHONPATH")
    env_pp = f"PYTHONPATH={shlex.quote(pp)} " if pp else ""
    print(f"chaos benchmark: {env_pp}{command}   # in {os.getcwd()}")
    tmp = Path(tempfile.mkdtemp(prefix="mscon-bench-chaos-"))
    cluster = None
    results: list[Result] = []
    watch = Contention()
    watch.start()
    try:
        if a.net_py:
            print(f"net.py: {net_data_note(a)}", flush=True)
            a.net_work = tmp / "net-work"  # mscon's workdir: examples/net.py alone
            a.net_work.mkdir()
            shutil.copy(NET_EXAMPLE, a.net_work / NET_SCRIPT)
            a.net_data = write_net_data(tmp / "net-mnist", a.net_samples)
        if any(v != "msrun" for v in a.variants):
            cluster = sshd_nodes().start_sshd_cluster(tmp / "sshd", n=a.nodes)
            print(f"sshd nodes: {', '.join(f'{n.host}:{n.port}' for n in cluster.nodes)}", flush=True)
        for variant in a.variants:
            wait_idle(watch, a.max_wait_idle)
            hosts = ["127.0.0.1", *(f"127.0.0.{k + 2}" for k in range(a.nodes))]
            port = sshd_nodes().find_free_port(hosts)
            watch.reset(port)
            res = Result(variant, world)
            results.append(res)
            print(f"{variant}: running for {a.duration:.0f} s ...", flush=True)
            try:
                if variant == "msrun":
                    run_msrun(res, a, tmp, port)
                else:
                    run_mscon(res, cluster, a, tmp, port)
            except (RuntimeError, OSError) as exc:
                res.error = str(exc)
            watch.sample()
            res.foreign, res.foreign_cpu = watch.peak, watch.cpu
    except KeyboardInterrupt:
        print("interrupted; partial results:")
    finally:
        end_bench(watch, cluster, tmp, a.keep)
    report(results, a)
    line = json.dumps({
        "bench": "chaos", "command": command, "duration_s": a.duration, "every_s": a.every, "seed": a.seed,
        "world": world, "variants": {r.variant: r.raw() for r in results},
    })  # fmt: skip
    print(line)
    if a.json is not None:
        a.json.write_text(line + "\n", encoding="utf-8")
    return 0 if results and not any(r.error for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
