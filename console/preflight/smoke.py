"""The collective smoke test: one real MindSpore AllReduce over every rank of the inventory.

``mscon check`` ships this file as the job's script and launches it the way it launches a job (the
Supervisor with its script overridden), so it tests the very path a training takes: the scheduler
address, the port, MindSpore's cluster set-up and the collective library (MCCL on CPU, NCCL on GPU,
HCCL on Ascend). Every worker contributes ``rank + 1``; the sum must be ``n (n + 1) / 2`` everywhere.
With ``--sweep-max-bytes N`` it then sweeps message sizes from 1 KiB to N and reports bus bandwidth
(algbw x 2 (n - 1) / n, as nccl-tests defines it): the console asks for 256 MiB on GPU/Ascend, and
for 1 MiB on CPU only when told to (``mscon check --sweep``: MCCL over TCP, every size compiles a
graph). Results are one ``MSCON_SMOKE {json}`` line per measurement on stdout.

Runs on the nodes with their Python and MindSpore, never imported by the console.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

TAG = "MSCON_SMOKE"
_CHECK_ELEMENTS = 1024  # float32: the correctness check's message, 4 KiB
_CHECK_REPEATS = 5


def sweep_sizes(max_bytes: int) -> tuple[int, ...]:
    """1 KiB, 4 KiB, 16 KiB ... up to ``max_bytes``."""
    return tuple(4**k * 1024 for k in range(0, 16) if 4**k * 1024 <= max_bytes)


def say(kind: str, **fields: Any) -> None:
    print(f"{TAG} " + json.dumps({"kind": kind, **fields}, separators=(",", ":")), flush=True)


def scheduler() -> int:
    """MindSpore's scheduler only serves init(); it exits once every worker has unregistered."""
    from mindspore.communication import init

    try:
        init()
    except RuntimeError as exc:
        print(f"{TAG} scheduler: cluster failed: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


def _sync(ms: Any, out: Any) -> None:
    """Wait for the device: the timing must include the collective, not just its launch."""
    sync = getattr(getattr(ms, "runtime", None), "synchronize", None)
    if sync is not None:
        sync()
    else:  # older MindSpore: a host copy waits for the stream
        out.asnumpy()


def worker(target: str, sweep_max_bytes: int) -> int:
    t_start = time.perf_counter()
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops
    from mindspore.communication import get_group_size, get_rank, init

    device_id = os.environ.get("DEVICE_ID")
    ms.set_device(target, int(device_id) if device_id else None)
    ms.set_context(mode=ms.GRAPH_MODE)
    t_import = time.perf_counter()
    init()
    rank, size = get_rank(), get_group_size()
    t_init = time.perf_counter()

    class Sum(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.op = ops.AllReduce(ops.ReduceOp.SUM)  # the CPU backend (MCCL) reduces with SUM only

        def construct(self, x: Any) -> Any:
            return self.op(x)

    allreduce = Sum()
    x = ms.Tensor(np.full(_CHECK_ELEMENTS, rank + 1, dtype=np.float32))
    first = allreduce(x).asnumpy()  # compiles the graph, then runs it once
    t_first = time.perf_counter()
    expected = size * (size + 1) / 2
    ok = bool(np.allclose(first, expected))
    times = []
    for _ in range(_CHECK_REPEATS):
        t0 = time.perf_counter()
        out = allreduce(x).asnumpy()
        times.append(time.perf_counter() - t0)
        ok = ok and bool(np.allclose(out, expected))
    say(
        "check",
        rank=rank,
        size=size,
        ok=ok,
        got=float(first.flat[0]),
        expected=expected,
        bytes=int(x.nbytes),
        allreduce_ms=1000 * sorted(times)[len(times) // 2],
        import_s=t_import - t_start,
        init_s=t_init - t_import,
        first_s=t_first - t_init,
        target=target,
    )
    if ok and sweep_max_bytes > 0:
        sweep(ms, np, allreduce, rank, size, sweep_sizes(sweep_max_bytes))
    return 0 if ok else 3


def sweep(ms: Any, np: Any, allreduce: Any, rank: int, size: int, sizes: tuple[int, ...]) -> None:
    """Bus bandwidth per message size; every rank times the same sizes in the same order."""
    factor = 2 * (size - 1) / size if size > 1 else 1.0
    for nbytes in sizes:
        x = ms.Tensor(np.ones(nbytes // 4, dtype=np.float32))
        repeats = 20 if nbytes <= 2**20 else 5
        for _ in range(2):  # the first call compiles this shape
            _sync(ms, allreduce(x))
        t0 = time.perf_counter()
        for _ in range(repeats):
            out = allreduce(x)
        _sync(ms, out)
        seconds = (time.perf_counter() - t0) / repeats
        algbw = nbytes / seconds / 1e9
        say(
            "sweep",
            rank=rank,
            size=size,
            bytes=nbytes,
            time_us=seconds * 1e6,
            algbw_gbs=algbw,
            busbw_gbs=algbw * factor,
        )


def main(argv: list[str]) -> int:
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings would drown the result lines
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return scheduler()
    sweep_max = 0
    if len(argv) == 2 and argv[0] == "--sweep-max-bytes" and argv[1].isdigit():
        sweep_max = int(argv[1])
    return worker(os.environ.get("DEVICE_TARGET", "CPU"), sweep_max)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
