"""What mscon_resume costs a training step, and how much node memory its snapshots take.

For each state size, one process trains a wide square layer with SGD (the state: its weights and
SGD's two arrays of the same size) for ``--steps`` steps three times: plain, with the library's
``Resumer`` at every step boundary (what ``batches`` and ``ResumeCallback`` call: the metrics
record, and a snapshot every step until timed, then at the interval the budget allows), plain
again. It prints the mean wall time per step of each (the library's after its interval is
chosen), its overhead against the mean of the two plain runs, the interval, the copy's time on
the training thread, and the most /dev/shm its snapshots held (sampled every 5 ms) as a multiple
of the state. The overhead is measured over ``--steps``: use at least three intervals' worth.
``--model resnet18`` trains MindCV's ResNet-18 instead (``bench/snapshot_cost.py``'s build: 89 MiB
of state) and also prints each snapshot's parts (CPU time, medians): the copy on the step, the
background write and its MAC, and the step's wait for the write before. ``--every N`` fixes the
interval (1: a snapshot every step) instead of ``auto``. Beside the wall time's overhead it prints
the process's CPU time's (every thread's, the background write's included): on a machine others
load too, the wall time swings with them, the CPU time a step takes much less.

    .venv/bin/python bench/resume_overhead.py [--sizes-mb 10,100,1000] [--steps 60] [--budget 0.02]
    .venv/bin/python bench/resume_overhead.py --model resnet18 --steps 20 [--every 1] [--batch 8]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _du(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class Peak:
    """The most bytes a folder (and its alternates) held, sampled on a thread."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.peak, self._stop = folder, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _du(self.folder))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="10,100,1000")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--model", choices=("wide", "resnet18"), default="wide")
    ap.add_argument("--every", default="auto", help="the snapshot interval: auto, or a number of steps")
    ap.add_argument("--batch", type=int, default=8, help="resnet18: the batch (snapshot_cost.py's)")
    a = ap.parse_args()

    import mindspore as ms
    import numpy as np
    from mindspore import nn

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(1)
    print(f"{'state':>8} {'plain s/step':>13} {'library s/step':>15} {'overhead':>9} ", end="")
    print(
        f"{'every':>6} {'copy ms':>8} {'shm peak':>9} {'plain cpu s':>12} {'library cpu':>11} {'cpu ovh':>9}"
    )
    if a.model == "resnet18":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from snapshot_cost import build

        train, keep, batch = build("resnet18", a.batch, 32)
        measure(lambda: train(*batch), [train], a.steps, a.budget, a.every, parts=True)
        return
    for mb in (int(x) for x in a.sizes_mb.split(",")):
        step, kept = wide(ms, np, nn, mb)
        measure(step, kept, a.steps, a.budget, a.every)


def wide(ms: Any, np: Any, nn: Any, mb: int) -> tuple[Callable[[], Any], list]:
    """One training step of a wide square layer with SGD whose state is about ``mb`` MB, and what it keeps."""
    # SGD keeps two more arrays of the weights' size (accum, stat): the state is 3x the weights.
    d = int(math.sqrt(mb * 2**20 / 4 / 3))
    net = nn.Dense(d, d, has_bias=False)
    opt = nn.SGD(net.trainable_params(), 1e-4)
    loss_fn = nn.MSELoss()

    def forward(x, y):  # noqa: ANN001, ANN202
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step(x, y):  # noqa: ANN001, ANN202
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    x = ms.Tensor(np.random.default_rng(0).standard_normal((8, d)).astype(np.float32))
    return lambda: step(x, x), [net, opt]


def measure(
    one_step: Callable[[], Any],
    kept: list,
    steps: int,
    budget: float,
    every: str,
    parts: bool = False,
) -> None:
    from mscon_resume import core, store

    cpu: list[float] = []  # the process's CPU time of each iteration of the last run

    def run(n: int, resumer: Any = None) -> list[float]:
        """Each iteration's wall time: the step, and the library's work at its boundary."""
        times = []
        cpu.clear()
        last, last_cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            one_step().asnumpy()
            now = time.perf_counter()
            if resumer is not None:
                resumer.stepped(i + 1, 0, i + 1, now - last)
                now = time.perf_counter()
            times.append(now - last)
            cpu.append(time.process_time() - last_cpu)
            last, last_cpu = now, time.process_time()
        return times

    run(2)  # compile
    before = run(steps)
    before_cpu = list(cpu)
    state = Path(tempfile.mkdtemp(prefix="mscon-bench-state-"))
    resumer = core.Resumer(str(state), every if every == "auto" else int(every), budget)
    params = core.kept_parameters(*kept)
    state_bytes = sum(int(p.nbytes) for _, p in params)
    resumer.keep(params)
    with Peak(Path(store.shm_folder(str(state)))) as peak:
        lib = run(steps, resumer)
        c0 = time.process_time()
        if resumer.writer is not None:
            resumer.writer.wait()
        cpu[-1] += time.process_time() - c0  # the last write's rest
        lib_cpu = list(cpu)
    interval = resumer.interval.every
    w = resumer.writer
    copy_ms = 1e3 * w.copy_s / max(w.count, 1) if w else 0.0
    if parts and w is not None and hasattr(w, "macs"):  # (the library before 5e40a12 did not time its MAC)
        said = (
            f"per snapshot ({w.count}, CPU ms, medians): copy {1e3 * w.typical_copy_s():.1f} on the step, "
            f"write {1e3 * w.typical_write_s():.1f} (MAC {1e3 * w.typical_mac_s():.1f}) in the background, "
            f"wait for the write before {1e3 * w.wait_s / max(w.count, 1):.1f} (mean, wall)"
        )
        print(said, flush=True)
    resumer.finish()
    after = run(steps)
    shutil.rmtree(state, ignore_errors=True)
    base = statistics.mean(before + after)
    base_cpu = statistics.mean(before_cpu + cpu)
    # Once the interval is chosen (auto); a fixed one's first two copies pay the memory's page faults.
    start = 1 + resumer.interval.PROBE_STEPS if resumer.interval.auto else 2
    steady, steady_cpu = statistics.mean(lib[start:]), statistics.mean(lib_cpu[start:])
    print(
        f"{state_bytes / 2**20:>6.0f}MB {base:>13.4f} {steady:>15.4f} {100 * (steady - base) / base:>8.2f}% "
        f"{interval:>6} {copy_ms:>8.1f} {peak.peak / state_bytes:>8.2f}x "
        f"{base_cpu:>12.4f} {steady_cpu:>11.4f} {100 * (steady_cpu - base_cpu) / base_cpu:>8.2f}%",
        flush=True,
    )


if __name__ == "__main__":
    main()
