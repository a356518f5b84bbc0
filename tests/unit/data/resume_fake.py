"""A stand-in for a training script under ``mscon_resume.check``, without MindSpore: it writes
the library's metrics records and lines itself and keeps its state in ``$MSCON_STATE_DIR``.

``--mode``: ``exact`` resumes with all its state; ``differs`` resumes the step but not the weight;
``refuses`` refuses to resume as the library does; ``fails`` exits 1 after training; ``over``
ignores ``MSCON_RESUME`` and starts over. Each step takes ``--step-s`` (its work: the check kills
the second run at a step, so the run must not be over before the check sees that step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--mode", default="exact")
p.add_argument("--steps", type=int, default=25)
p.add_argument("--step-s", type=float, default=0.02)
a = p.parse_args()

state_file = os.path.join(os.environ["MSCON_STATE_DIR"], "state.json")
metrics = open(os.environ["MSCON_METRICS"], "a", buffering=1)  # noqa: SIM115 - the run's length
resuming = os.environ.get("MSCON_RESUME") == "1" and a.mode != "over"

step, w = 0, 1.0
print("training starts")
if resuming and a.mode == "refuses":
    reason = "the optimizer is not kept"
    print(f"mscon_resume: rank 0 refuses to resume: {reason}; pass keep=(net, optimizer)", flush=True)
    metrics.write(json.dumps({"resume": {"step": 0, "source": "refused", "reason": reason}}) + "\n")
    sys.exit(65)
if resuming and os.path.exists(state_file):
    with open(state_file) as f:
        saved = json.load(f)
    step = saved["step"]
    w = saved["w"] if a.mode != "differs" else w
    print(f"mscon_resume: rank 0 resumes after step {step} (snapshot saved now)", flush=True)
metrics.write(json.dumps({"resume": {"step": step, "source": "snapshot" if step else "none"}}) + "\n")

while step < a.steps:
    step += 1
    w = w * 0.9 + step * 0.01
    time.sleep(a.step_s)  # the step's work
    os.makedirs(os.path.dirname(state_file), exist_ok=True)
    with open(state_file + ".tmp", "w") as f:
        json.dump({"step": step, "w": w}, f)
    os.replace(state_file + ".tmp", state_file)
    metrics.write(
        json.dumps({"step": step, "loss": w * w, "lr": 0.1, "ts": time.time(), "step_time_s": a.step_s})
        + "\n"
    )
    if step % 5 == 0:
        print(f"step {step} loss {w * w:.6f}", flush=True)

metrics.write(
    json.dumps(
        {"final": {"stage": "train", "step": step, "digest": f"{w:.12f}", "parts": {"w": f"{w:.12f}"}}}
    )
    + "\n"
)
print("done", flush=True)
sys.exit(1 if a.mode == "fails" else 0)
