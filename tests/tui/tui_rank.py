"""A fake rank for the console tests: LossMonitor lines, metrics with step times, a slow rank, and a
real Python traceback on demand. No MindSpore. Knobs:
  --steps N --rate R        steps and steps per second (per rank)
  --slow-rank R --slow X    rank R takes X times as long per step (a straggler)
  --fail-rank R --fail-step S   rank R raises a RuntimeError at step S (on the first attempt only)
  --lines-per-step K        extra log lines per step
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def train_step(rank: int, step: int) -> None:
    raise RuntimeError(f"NaN in gradients on rank {rank} at step {step}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--slow-rank", type=int, default=-2)
    p.add_argument("--slow", type=float, default=2.0)
    p.add_argument("--fail-rank", type=int, default=-2)
    p.add_argument("--fail-step", type=int, default=10)
    p.add_argument("--lines-per-step", type=int, default=0)
    a = p.parse_args()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        print("fake scheduler: nothing to coordinate")
        return 0
    rank = int(os.environ.get("RANK_ID", "0"))
    attempt = int(os.environ.get("MSCON_ATTEMPT", "0"))
    path = os.environ.get("MSCON_METRICS")
    metrics = open(path, "a") if path else None  # noqa: SIM115
    print(f"rank {rank} of {os.environ.get('RANK_SIZE', '1')} starting (attempt {attempt})", flush=True)
    period = (1.0 / a.rate if a.rate > 0 else 0.0) * (a.slow if rank == a.slow_rank else 1.0)
    loss = 2.3 + 0.01 * rank
    for step in range(1, a.steps + 1):
        t0 = time.time()
        if rank == a.fail_rank and step == a.fail_step and attempt == 0:
            train_step(rank, step)
        if period:
            time.sleep(period)
        loss *= 0.97
        for i in range(a.lines_per_step):
            print(f"rank {rank} step {step} detail {i}")
        print(f"epoch: 1 step: {step}, loss is {loss:.6f}", flush=True)
        if metrics is not None:
            dt = time.time() - t0
            record = {
                "step": step,
                "epoch": 1,
                "loss": loss,
                "ts": time.time(),
                "step_time_s": dt,
                "samples_per_s": 32 / dt if dt > 0 else None,
            }
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
    print("training finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
