"""The request's parameters as the checks read them (they arrive as JSON from the console)."""

from __future__ import annotations

import math
import os
import sys

from .. import rank_env

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MINDSPORE_TIMEOUT_S = 60.0
DEFAULT_SHM_MIN_GIB = 1.0
DEFAULT_DISK_MIN_GIB = 1.0


class Params:
    """The request's parameters, each coerced to its type with a default (they come from JSON)."""

    def __init__(self, raw: dict, received_ns: int) -> None:
        self.raw = raw
        self.received_ns = received_ns
        target = str(raw.get("device_target") or "CPU").strip()
        self.target = {"gpu": "GPU", "ascend": "Ascend", "npu": "Ascend", "cpu": "CPU"}.get(
            target.lower(), target
        )
        self.devices = _opt_int(raw.get("devices"))
        self.python = _opt_str(raw.get("python")) or sys.executable or "python3"
        job_env = raw.get("env")
        self.job_env = {str(k): str(v) for k, v in job_env.items()} if isinstance(job_env, dict) else {}
        self.shm_path = _opt_str(raw.get("shm_path")) or "/dev/shm"
        self.shm_min_gib = _opt_float(raw.get("shm_min_gib"), DEFAULT_SHM_MIN_GIB)
        self.disk_min_gib = _opt_float(raw.get("disk_min_gib", raw.get("min_disk_gib")), DEFAULT_DISK_MIN_GIB)
        self.workdir = _opt_str(raw.get("workdir"))
        self.checkpoint_dir = _opt_str(raw.get("checkpoint_dir"))
        self.sched_port = _opt_int(raw.get("sched_port"))
        # The standby clusters' scheduler ports (protocol.standby_port), when restarts may use them
        self.standby_ports = [p for p in (raw.get("standby_ports") or []) if isinstance(p, int)]
        self.sched_host = _opt_str(raw.get("sched_host"))
        self.is_first = bool(raw.get("is_first", False))
        self.timeout_s = _opt_float(raw.get("timeout_s"), DEFAULT_TIMEOUT_S)
        self.mindspore_timeout_s = _opt_float(raw.get("mindspore_timeout_s"), DEFAULT_MINDSPORE_TIMEOUT_S)
        self.mindspore_version = _opt_str(raw.get("mindspore_version"))
        self.nodes = _opt_int(raw.get("nodes"))
        self.world_size = _opt_int(raw.get("world_size"))  # every rank of the job, all nodes
        self.console_time_ns = _opt_int(raw.get("console_time_ns"))

    def env_value(self, key: str) -> str | None:
        """The value the ranks will see: the job's env first, then the node's own."""
        if key in self.job_env:
            return self.job_env[key]
        return os.environ.get(key)

    def rank_env(self) -> dict:
        """The environment the ranks get (as procs.launch builds it)."""
        env = dict(os.environ)
        env.update(self.job_env)
        prepend = env.pop(rank_env.PATH_PREPEND, "")
        if prepend:
            env["PATH"] = prepend + os.pathsep + env.get("PATH", os.defpath)
        return env

    def cwd(self) -> str | None:
        return self.workdir if self.workdir and os.path.isdir(self.workdir) else None


# ------------------------------------------------------------------ helpers


def _opt_int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v.strip())
    return None


def _opt_float(v: object, default: float) -> float:
    if isinstance(v, bool):
        return default
    try:
        f = float(v) if isinstance(v, (int, float, str)) else default
    except ValueError:
        return default
    return f if math.isfinite(f) else default


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None
