"""Run a rank's script on a box with fewer GPUs than ranks (testing only): ``job.script`` points
here and ``job.args`` start with the real script, e.g. ``[trainer/train.py, --device-target, GPU]``.

NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"), so each rank claims its
own NCCL_HOSTID (NCCL then sees separate hosts and joins them over loopback sockets) and takes GPU
``rank % MSCON_GPUS`` (default 1). Nothing else changes: the script runs as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: shared_gpu_rank.py SCRIPT [ARGS...]")
    rank = os.environ.get("RANK_ID") or os.environ.get("MS_NODE_ID") or "sched"
    os.environ["NCCL_HOSTID"] = f"mscon-shared-gpu-{rank}"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if rank.isdigit():
        os.environ["DEVICE_ID"] = str(int(rank) % int(os.environ.get("MSCON_GPUS", "1")))
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
