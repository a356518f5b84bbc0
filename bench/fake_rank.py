"""A fast fake rank for scale tests and benchmarks: no MindSpore, same env and output shape.

It reads the env the agent gives a rank (MS_ROLE, RANK_ID, MSCON_METRICS) and prints
LossMonitor-style lines. Knobs, all optional:
  --steps N          steps to run (default 50)
  --rate R           steps per second (default 50; 0 = as fast as possible)
  --lines-per-step K extra log lines per step (for ingest benchmarks)
  --fail-rank R      this rank exits with --fail-code at --fail-step
  --hang-rank R      this rank stops making progress at --fail-step (sleeps forever)
  --metrics          also write MSCON_METRICS JSON lines (with a parameter checksum every 5 steps)
  --phases           with --metrics: the trainer's start-up phase records first (imported, joined,
                     ready, compiled), --phase-gap seconds apart (default 0.05)
  --diverge-rank R   this rank's checksum differs from the others' (a broken replica)
  --slow-rank R --slow X  this rank takes X times as long per step (a straggler)
The scheduler role exits at once with 0 (there is no real cluster to coordinate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--lines-per-step", type=int, default=0)
    p.add_argument("--fail-rank", type=int, default=-2)
    p.add_argument("--fail-step", type=int, default=10)
    p.add_argument("--fail-code", type=int, default=3)
    p.add_argument("--hang-rank", type=int, default=-2)
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--phases", action="store_true")
    p.add_argument("--phase-gap", type=float, default=0.05)
    p.add_argument("--diverge-rank", type=int, default=-2)
    p.add_argument("--slow-rank", type=int, default=-2)
    p.add_argument("--slow", type=float, default=1.0)
    a = p.parse_args()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        print("fake scheduler: nothing to coordinate")
        return 0
    rank = int(os.environ.get("RANK_ID", "0"))
    metrics = open(os.environ["MSCON_METRICS"], "a") if a.metrics and "MSCON_METRICS" in os.environ else None
    print(f"fake rank {rank} of {os.environ.get('RANK_SIZE', '1')} starting", flush=True)
    if metrics is not None and a.phases:
        for name in ("imported", "joined", "ready", "compiled"):
            time.sleep(a.phase_gap)
            metrics.write(json.dumps({"phase": name, "ts": time.time()}) + "\n")
            metrics.flush()
    loss = 2.5
    filler = "x" * 60
    period = (1.0 / a.rate if a.rate > 0 else 0.0) * (a.slow if rank == a.slow_rank else 1.0)
    t_step = time.time()
    for step in range(1, a.steps + 1):
        if rank == a.fail_rank and step == a.fail_step:
            print(f"RuntimeError: fake failure on rank {rank} at step {step}", file=sys.stderr, flush=True)
            return a.fail_code
        if rank == a.hang_rank and step == a.fail_step:
            print(f"rank {rank} hanging at step {step}", flush=True)
            while True:
                time.sleep(3600)
        loss *= 0.98
        out = [f"epoch: 1 step: {step}, loss is {loss:.6f}"]
        out += [f"rank {rank} step {step} line {i} {filler}" for i in range(a.lines_per_step)]
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()
        if metrics is not None:
            now = time.time()
            record = {"step": step, "epoch": 1, "loss": loss, "ts": now}
            if step > 1:  # the time since the last step's record (the first has no last)
                record["step_time_s"] = now - t_step
            t_step = now
            if step % 5 == 0:
                record["param_checksum"] = f"sum-{step}" + ("-odd" if rank == a.diverge_rank else "")
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
        if period:
            time.sleep(period)
    print("training finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
