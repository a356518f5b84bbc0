"""What mscon_resume costs a training step, and how much node memory its snapshots take.

For each state size, one process trains a wide square layer with SGD (the state: its weights and
SGD's two arrays of the same size) for ``--steps`` steps three times: plain, with the library's
``Resumer`` at every step boundary (what ``batches`` and ``ResumeCallback`` call: the metrics
record, and a snapshot every step until timed, then at the interval the budget allows), plain
again. It prints the mean wall time per step of each (the library's after its interval is
chosen), its overhead against the mean of the two plain runs, the interval, the copy's time on
the training thread, and the most /dev/shm its snapshots held (sampled every 5 ms) as a multiple
of the state. The overhead is measured over ``--steps``: use at least three intervals' worth.

    .venv/bin/python bench/resume_overhead.py [--sizes-mb 10,100,1000] [--steps 60] [--budget 0.02]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
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
    a = ap.parse_args()

    import mindspore as ms
    import mindspore.dataset as ds
    import numpy as np
    from mindspore import nn

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(1)
    print(f"{'state':>8} {'plain s/step':>13} {'library s/step':>15} {'overhead':>9} ", end="")
    print(f"{'every':>6} {'copy ms':>8} {'shm peak':>9}")
    for mb in (int(x) for x in a.sizes_mb.split(",")):
        measure(ms, ds, np, nn, mb, a.steps, a.budget)


def measure(ms: Any, ds: Any, np: Any, nn: Any, mb: int, steps: int, budget: float) -> None:
    from mscon_resume import core, store

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

    def run(n: int, resumer: Any = None) -> list[float]:
        """Each iteration's wall time: the step, and the library's work at its boundary."""
        times = []
        last = time.perf_counter()
        for i in range(n):
            step(x, x).asnumpy()
            now = time.perf_counter()
            if resumer is not None:
                resumer.stepped(i + 1, 0, i + 1, now - last)
                now = time.perf_counter()
            times.append(now - last)
            last = now
        return times

    run(2)  # compile
    before = run(steps)
    state = Path(tempfile.mkdtemp(prefix="mscon-bench-state-"))
    resumer = core.Resumer(str(state), "auto", budget)
    params = core.kept_parameters(net, opt)
    state_bytes = sum(int(p.nbytes) for _, p in params)
    resumer.keep(params)
    with Peak(Path(store.shm_folder(str(state)))) as peak:
        lib = run(steps, resumer)
        if resumer.writer is not None:
            resumer.writer.wait()
    every = resumer.interval.every
    copy_ms = 1e3 * resumer.writer.copy_s / max(resumer.writer.count, 1) if resumer.writer else 0.0
    resumer.finish()
    after = run(steps)
    shutil.rmtree(state, ignore_errors=True)
    base = statistics.mean(before + after)
    steady = statistics.mean(lib[1 + resumer.interval.PROBE_STEPS :])  # once the interval is chosen
    print(
        f"{state_bytes / 2**20:>6.0f}MB {base:>13.4f} {steady:>15.4f} {100 * (steady - base) / base:>8.2f}% "
        f"{every:>6} {copy_ms:>8.1f} {peak.peak / state_bytes:>8.2f}x",
        flush=True,
    )


if __name__ == "__main__":
    main()
