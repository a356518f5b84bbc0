"""The trainer's GPU-only paths, each a real ``mscon run --no-tui`` on a GPU box: prints a table.

The CPU backend refuses semi_auto/auto/hybrid parallel, so these runs need NCCL on GPUs:

    python bench/gpu_modes.py [--ranks 2] [--gpus 1] [--steps 12] [--only semi_mp auto_dp ...]

Cases: data parallel (fp32 and AMP O2 with dynamic loss scale), semi_auto_parallel with the MLP
split over the model axis (strategy 1xN) and saving its strategy file, the same again loading it,
semi_auto_parallel data-split with the parallel optimizer and AllReduce fusion, auto_parallel with
sharding propagation and with dynamic programming, hybrid parallel, and a data-parallel run whose
rank 1 is killed at step 6 followed by a ``--resume`` run. Each case checks what it is for: the run
succeeds, rank 0's loss falls (first vs last step), the strategy file appears / is loaded, the
resumed run starts past step 0. Ranks beyond --gpus share GPUs through bench/shared_gpu_rank.py.

Runs from the repository root with a Python that has mindspore (GPU build) and mscon importable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Case:
    name: str
    args: list[str]
    check: str = "loss"  # loss | strategy_saved | strategy_loaded | resume
    then_args: list[str] = field(default_factory=list)  # second run (resume), same checkpoint dir


def cases(ranks: int) -> list[Case]:
    sp = ["--model", "mlp"]
    # Run twice: the first run saves the strategy file, the second loads it.
    model_split = [
        *sp,
        "--parallel-mode",
        "semi_auto_parallel",
        "--strategy",
        f"1,{ranks}",
        "--strategy-ckpt-dir",
        "{tmp}/strategy",
    ]
    semi_popt = ["--parallel-mode", "semi_auto_parallel", "--strategy", f"{ranks},1", "--parallel-optimizer"]
    return [
        Case("dp", [*sp, "--parallel-mode", "data_parallel"]),
        Case("dp_amp_o2", [*sp, "--parallel-mode", "data_parallel", "--amp-level", "O2"]),
        Case(
            "semi_mp",
            model_split,
            check="strategy_saved",
        ),
        Case(
            "semi_mp_load",
            model_split,
            check="strategy_loaded",
        ),
        Case("semi_dp_popt_fusion", [*sp, *semi_popt, "--comm-fusion-mb", "16"]),
        Case("auto_sp", [*sp, "--parallel-mode", "auto_parallel", "--search-mode", "sharding_propagation"]),
        Case("auto_dp", [*sp, "--parallel-mode", "auto_parallel", "--search-mode", "dynamic_programming"]),
        Case("hybrid", [*sp, "--parallel-mode", "hybrid_parallel"]),
        kill_resume("dp_kill_resume", [*sp, "--parallel-mode", "data_parallel"], ranks),
        # The cell runner's checkpoints gather sharded weights (parallel optimizer) into full ones.
        kill_resume("semi_popt_kill_resume", [*sp, *semi_popt], ranks),
    ]


def kill_resume(name: str, mode_args: list[str], ranks: int) -> Case:
    """Rank 1 SIGKILLs itself at step 6 (checkpoints every 4); then a --resume run."""
    ckpt = ["--checkpoint-dir", "{tmp}/ckpt_" + name, "--checkpoint-every", "4"]
    return Case(
        name,
        [*mode_args, *ckpt, "--die-at-step", "6", "--die-rank", str(min(1, ranks - 1))],
        check="resume",
        then_args=[*mode_args, *ckpt, "--resume"],
    )


def write_inventory(path: Path, a: argparse.Namespace, args: list[str]) -> None:
    shared = a.device_target == "GPU" and a.ranks > a.gpus
    script = ["bench/shared_gpu_rank.py", "trainer/train.py"] if shared else ["trainer/train.py"]
    inv = {
        "name": path.stem,
        "device_target": a.device_target,
        "nodes": [{"host": "localhost", "name": "gpu", "transport": "local", "devices": a.ranks}],
        "scheduler": {"port": 18200 + os.getpid() % 500},
        "job": {
            "workdir": str(REPO),
            "script": script[0],
            "args": [*script[1:], *args],
            "env": {"GLOG_v": "3", "MSCON_GPUS": str(a.gpus)},  # ranks inherit this shell's env too
        },
        "stop": {"grace_s": 3},
    }
    path.write_text(json.dumps(inv))  # JSON is YAML


def mscon_run(tmp: Path, tag: str, a: argparse.Namespace, args: list[str]) -> dict:
    inv = tmp / f"{tag}.yaml"
    write_inventory(inv, a, args)
    summary = tmp / f"{tag}.json"
    logs = tmp / f"{tag}-logs"
    cmd = [
        sys.executable,
        "-m",
        "mscon.console",
        "run",
        "--no-tui",
        "-q",
        str(inv),
        "--json",
        str(summary),
        "--logs-dir",
        str(logs),
    ]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=a.timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = -1, f"timed out after {a.timeout:.0f} s\n{exc.stdout or ''}"
    wall = time.monotonic() - t0
    (tmp / f"{tag}.out").write_text(out)
    res = json.loads(summary.read_text()) if summary.exists() else {}
    return {"rc": rc, "wall": wall, "out": out, "summary": res, "logs": logs}


def losses(out: str) -> list[float]:
    """Rank 0's losses, in step order (mscon prefixes each rank's lines with ``[node rN]``)."""
    mine = [line for line in out.splitlines() if " r0] " in line and "loss is" in line]
    return [float(line.rsplit("loss is", 1)[1]) for line in mine]


def run_case(c: Case, a: argparse.Namespace, root: Path) -> tuple[str, str]:
    tmp = root / c.name
    tmp.mkdir()
    common = [
        "--device-target",
        a.device_target,
        "--epochs",
        "1",
        "--steps-per-epoch",
        str(a.steps),
        "--batch-size",
        str(16 * a.ranks),
    ]

    def fill(xs: list[str]) -> list[str]:
        return [x.replace("{tmp}", str(root)) for x in xs]

    r = mscon_run(tmp, "run", a, [*common, *fill(c.args)])
    ls = losses(r["out"])
    detail = f"{r['wall']:.0f} s, {len(ls)} rank-0 steps"
    if ls:
        detail += f", loss {ls[0]:.3f} -> {ls[-1]:.3f}"
    if c.check == "resume":
        if r["rc"] == 0:
            return "FAIL", f"the run with a killed rank exited 0 ({detail})"
        r = mscon_run(tmp, "resume", a, [*common, *fill(c.then_args)])
        resumed = [line for line in r["out"].splitlines() if "resumed from step" in line]
        what = resumed[0].split("mscon-trainer: ")[-1] if resumed else "no resume"
        detail = f"{r['wall']:.0f} s; {what}"
        if r["rc"] != 0:
            return "FAIL", f"{detail}; rc {r['rc']}: {tail(r['out'])}"
        return ("ok" if resumed else "FAIL"), detail
    if r["rc"] != 0:
        return "FAIL", f"rc {r['rc']}: {tail(r['out'])}"
    if len(ls) < 2 or not ls[-1] < ls[0]:
        return "FAIL", f"loss did not fall ({detail})"
    strategy = root / "strategy" / "strategy.ckpt"
    if c.check == "strategy_saved":
        if not strategy.exists():
            return "FAIL", f"no {strategy} ({detail})"
        detail += f", strategy file {strategy.stat().st_size} B"
    if c.check == "strategy_loaded":
        detail += ", strategy file present before the run (loaded)"
    return "ok", detail


def tail(out: str, n: int = 3) -> str:
    keep = [line for line in out.splitlines() if line.strip()][-n:]
    return " | ".join(keep)[-600:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--gpus", type=int, default=1, help="GPUs on this box; ranks beyond share them")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--timeout", type=float, default=240.0, help="per mscon run, seconds")
    p.add_argument("--only", nargs="*", help="case names")
    p.add_argument("--device-target", default="GPU", help="CPU: only the data-parallel cases apply")
    p.add_argument("--trainer-args", nargs="*", default=[], help="appended to every case's trainer args")
    p.add_argument("--keep", type=Path, help="keep the runs' files here")
    a = p.parse_args(argv)
    chosen = [c for c in cases(a.ranks) if not a.only or c.name in a.only]
    root = a.keep or Path(tempfile.mkdtemp(prefix="mscon-gpu-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"{a.ranks} ranks on {a.gpus} GPU(s), {a.steps} steps per case; files in {root}", flush=True)
    failed = 0
    for c in chosen:
        status, detail = run_case(c, a, root)
        failed += status != "ok"
        print(f"{c.name:<22} {status:<5} {detail}", flush=True)
    print(f"{len(chosen) - failed}/{len(chosen)} cases ok", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
