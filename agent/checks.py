"""Preflight checks run on a node: what breaks a distributed MindSpore run, found before it breaks it.

``run_node_checks(names, params)`` runs the named checks and returns one or more results per check,
each ``{"name", "status", "value", "remedy", "detail"}`` with status ``ok``, ``warn``, ``fail`` or
``n/a``. It never raises: a missing tool is ``n/a`` where the device target does not need it and a
``fail`` with a remedy where it does; every subprocess has a time limit (its whole process group
is killed when it runs over); a check that crashes is reported as a ``warn`` naming the error.

Stdlib only (psutil optional), Python 3.8+: this runs with whatever Python the node has.

Checks (``NODE_CHECKS``, in display order) and the results they report:

- ``python``: ``python`` -- the node's Python for the ranks (``params["python"]``) runs; its
  version in ``value``.
- ``mindspore``: ``mindspore`` -- MindSpore imports in that Python, with the ranks' environment
  (``params["env"]`` over the node's, so its ``PYTHONPATH`` counts); the bare version in ``value``
  (e.g. ``2.10.0``) for the console to compare across nodes.
- ``devices``: GPU: ``gpu.count``, ``gpu.visible``, ``gpu.driver``, ``gpu.busy``, ``gpu.ecc``
  (``nvidia-smi``); Ascend: ``npu.count``, ``npu.visible``, ``npu.driver``, ``npu.health``,
  ``npu.busy`` (``npu-smi info``), ``npu.link``, ``npu.net`` (``hccn_tool``, where present);
  CPU: ``devices`` (n/a).
- ``shm``: ``shm`` -- size and free space of ``shm_path`` (default /dev/shm) vs ``shm_min_gib``.
- ``limits``: ``limits.memlock``, ``limits.nofile``.
- ``disk``: ``disk.workdir``, ``disk.checkpoint_dir`` -- free space vs ``disk_min_gib``.
- ``port``: ``port`` -- the scheduler port can be bound on the first node (n/a elsewhere).
- ``ifname``: ``ifname.NCCL_SOCKET_IFNAME`` / ``ifname.HCCL_SOCKET_IFNAME`` /
  ``ifname.GLOO_SOCKET_IFNAME`` for each one set, else ``ifname`` (n/a).
- ``env``: ``env.leftover``, ``env.nccl_disable``, ``env.timeouts``.
- ``clock``: ``clock`` -- this node's ``time.time_ns()`` (when the request arrived) in ``value``;
  the offset from ``params["console_time_ns"]`` in ``detail``.

Tool output formats parsed (the tests replay recorded outputs through fake executables):

- ``nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used,memory.total,utilization.gpu,
  ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits``: one CSV line per GPU
  (fields joined by ", "; an unsupported field reads ``[N/A]``, ``N/A`` or ``[Not Supported]``);
  ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader``: one line per
  compute process (``GPU-<uuid>, 4242, 1234 MiB``), nothing when there is none.
- ``npu-smi info``: the box table of the Ascend driver (Huawei "npu-smi info" reference): a header
  ``| npu-smi 23.0.6   Version: 23.0.6 |``; per chip two rows, ``| NPU  Name | Health | Power(W)
  Temp(C) Hugepages-Usage(page) |`` then ``| Chip [Phy-ID] | Bus-Id | AICore(%) Memory-Usage(MB)
  HBM-Usage(MB) |`` (``| 0  910B3 | OK | 93.6  40  0 / 0 |`` / ``| 0 | 0000:C1:00.0 | 0  0 / 0
  3161 / 65536 |``; chips of one NPU repeat its id); then a process table ``| NPU  Chip | Process id
  | Process name | Process memory(MB) |`` with ``No running processes found in NPU N`` rows when
  idle. Health is ``OK``, ``Warning``, ``Alarm`` or ``Critical``.
- ``hccn_tool -i N -link -g``: ``link status: UP`` (or ``DOWN``); ``hccn_tool -i N -net_health
  -g``: ``net health status: Success`` (else ``Fault``, ``Init``, ``Socket fail``, ...).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

from .procs import psutil_module

NODE_CHECKS = ("python", "mindspore", "devices", "shm", "limits", "disk", "port", "ifname", "env", "clock")
# Cheap enough (well under a second together) to run before every `mscon run`: no device tool,
# no MindSpore import. "python" starts the node's Python once (tens of milliseconds), unless the ranks
# run the agent's own interpreter.
QUICK_CHECKS = ("python", "shm", "limits", "disk", "port", "ifname", "env", "clock")

OK, WARN, FAIL, NA = "ok", "warn", "fail", "n/a"

GIB = 1024**3
MIB = 1024**2
DOCKER_SHM_DEFAULT = 64 * MIB

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MINDSPORE_TIMEOUT_S = 60.0
DEFAULT_SHM_MIN_GIB = 1.0
DEFAULT_DISK_MIN_GIB = 1.0
NOFILE_MIN = 65536

# Leftovers of another launcher in the node's own environment. mscon sets the MS_* ranks' values
# itself, but RANK_TABLE_FILE and friends leak into the ranks, and a stray MS_ROLE/MS_SCHED_PORT
# in a login environment is a known cause of "Address already in use" under orchestrators.
LEFTOVER_VARS = (
    "MS_ROLE",
    "MS_SCHED_HOST",
    "MS_SCHED_PORT",
    "MS_WORKER_NUM",
    "MS_NODE_ID",
    "RANK_ID",
    "RANK_SIZE",
    "RANK_TABLE_FILE",
)

# Timeouts that must fire in this order, narrowest first, so that the failure is reported by the
# layer that saw it (a dead peer's heartbeat before HCCL gives up connecting, and so on).
# MS_NODE_TIMEOUT: MindSpore dynamic cluster heartbeat timeout (docs: default 30 s).
# HCCL_CONNECT_TIMEOUT: HCCL link set-up (CANN docs: default 120 s, range [120, 7200]; note
#   MindSpore >= 2.x sets 600 at import when it is unset).
# MS_TOPO_TIMEOUT: MindSpore's cluster (networking phase) timeout; msrun's --cluster_time_out sets
#   it, default 600 s there (without msrun MindSpore's docs give 30 min).
# HCCL_EXEC_TIMEOUT: HCCL execution synchronisation wait (CANN docs: default 1800 s).
TIMEOUT_ORDER = (
    ("MS_NODE_TIMEOUT", 30),
    ("HCCL_CONNECT_TIMEOUT", 120),
    ("MS_TOPO_TIMEOUT", 600),
    ("HCCL_EXEC_TIMEOUT", 1800),
)

IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")

_SYS_NET = "/sys/class/net"
_IFF_UP = 0x1
# Where the device tools live when a non-login shell's PATH lacks them.
_FALLBACK_DIRS = (
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/usr/local/Ascend/driver/tools",
)


def result(name: str, status: str, value: str = "", remedy: str = "", detail: str = "") -> dict:
    return {"name": name, "status": status, "value": value, "remedy": remedy, "detail": detail}


# ------------------------------------------------------------------ entry point


def run_node_checks(names: Sequence[str], params: dict | None = None) -> list:
    """Run the named checks on this node; never raises. Each result:
    {"name": str, "status": "ok"|"warn"|"fail"|"n/a", "value": str, "remedy": str, "detail": str}"""
    received_ns = time.time_ns()
    out: list = []
    try:
        p = Params(params if isinstance(params, dict) else {}, received_ns)
        wanted = [names] if isinstance(names, str) else list(names or ())
    except Exception as exc:  # never raise
        return [result("checks", WARN, "bad request: %s" % _oneline(exc), "report this as an mscon bug")]
    seen = set()
    for name in wanted:
        if not isinstance(name, str) or name in seen:
            continue
        seen.add(name)
        fn = _CHECKS.get(name)
        if fn is None:
            out.append(
                result(
                    name, WARN, "unknown check", "update mscon on this node (the console and agent differ)"
                )
            )
            continue
        try:
            out.extend(fn(p))
        except Exception as exc:  # a bug in a check must not stop the others
            out.append(
                result(
                    name,
                    WARN,
                    "check crashed: %s: %s" % (type(exc).__name__, _oneline(exc)),
                    "report this as an mscon bug",
                )
            )
    return out


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
        prepend = env.pop("MSCON_PATH_PREPEND", "")
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


def _oneline(x: object, limit: int = 300) -> str:
    s = " ".join(str(x).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _size(n: float) -> str:
    if n >= GIB:
        return "%.1f GiB" % (n / GIB)
    if n >= MIB:
        return "%d MiB" % int(round(n / MIB))
    return "%d KiB" % int(round(n / 1024))


class Ran:
    """What a subprocess did: its exit code (None when it ran over its time limit or could not start)
    and its output."""

    def __init__(self, rc: int | None, out: str, err: str, missing: bool = False, error: str = "") -> None:
        self.rc = rc
        self.out = out
        self.err = err
        self.missing = missing
        self.error = error

    @property
    def timed_out(self) -> bool:
        return self.rc is None and not self.missing and not self.error

    def why(self, timeout: float) -> str:
        if self.missing:
            return "not found"
        if self.error:
            return self.error
        if self.timed_out:
            return "no answer within %gs" % timeout
        text = (self.err.strip() or self.out.strip()).splitlines()
        return "exit code %s%s" % (self.rc, (": " + _oneline(text[-1], 200)) if text else "")


def run_cmd(argv: list, timeout: float, env: dict | None = None, cwd: str | None = None) -> Ran:
    """Run argv with a time limit; its whole process group is killed when it runs over."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            close_fds=True,
            start_new_session=True,
            universal_newlines=True,
            errors="replace",
        )
    except FileNotFoundError:
        return Ran(None, "", "", missing=True)
    except OSError as exc:
        return Ran(None, "", "", error="cannot run: %s" % (exc.strerror or exc))
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.1))
        return Ran(proc.returncode, out or "", err or "")
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a descendant in another group holds the pipes
            proc.kill()
            out, err = "", ""
        return Ran(None, out or "", err or "")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def find_tool(name: str, env: dict) -> str | None:
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found:
        return found
    for d in _FALLBACK_DIRS:
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


# ------------------------------------------------------------------ python, mindspore

_PY_PROBE = "import platform,sys;print(platform.python_version());print(sys.executable)"

_MS_PROBE = r"""
import os, sys
try:
    import mindspore
except BaseException as exc:
    sys.stdout.write("MSCON_MS_ERROR=%s: %s\n" % (type(exc).__name__, " ".join(str(exc).split())[:400]))
    sys.stdout.flush()
    os._exit(3)
v = getattr(mindspore, "__version__", None)
if not v:
    try:
        from importlib.metadata import version
        v = version("mindspore")
    except Exception:
        v = "unknown"
sys.stdout.write("MSCON_MS_VERSION=%s\nMSCON_MS_FILE=%s\n" % (v, getattr(mindspore, "__file__", "")))
sys.stdout.flush()
os._exit(0)
"""


def _ranks_run_this_interpreter(p: Params) -> bool:
    """The ranks' python is the agent's own interpreter, started with the same PYTHON* variables.

    The agent was started with the node's python, so then there is nothing a probe could learn that
    this process does not know, and a second interpreter start per node is saved.
    """
    env = p.rank_env()
    found = shutil.which(p.python, path=env.get("PATH", os.defpath))
    if not found or os.path.abspath(found) != sys.executable:
        return False

    def startup(environ: dict) -> dict:
        return {k: v for k, v in environ.items() if k.startswith("PYTHON") and k not in _NO_STARTUP_EFFECT}

    return startup(os.environ) == startup(env)


# PYTHON* variables that cannot change which Python starts or whether it starts (the ranks get
# PYTHONUNBUFFERED from mscon itself); any other one (PYTHONHOME, PYTHONPATH, ...) gets a probe.
_NO_STARTUP_EFFECT = frozenset(
    [
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "PYTHONFAULTHANDLER",
        "PYTHONHASHSEED",
    ]
)


def check_python(p: Params) -> list:
    if _ranks_run_this_interpreter(p):
        return [result("python", OK, sys.version.split()[0], detail=sys.executable)]
    ran = run_cmd([p.python, "-c", _PY_PROBE], p.timeout_s, env=p.rank_env(), cwd=p.cwd())
    if ran.rc != 0:
        return [
            result(
                "python",
                FAIL,
                "%s: %s" % (p.python, ran.why(p.timeout_s)),
                "install Python on this node, or set the node's python: in the inventory",
                _oneline(ran.err or ran.out, 1000),
            )
        ]
    lines = ran.out.strip().splitlines()
    version = lines[0].strip() if lines else "?"
    exe = lines[1].strip() if len(lines) > 1 else p.python
    return [result("python", OK, version, detail=exe)]


def check_mindspore(p: Params) -> list:
    timeout = p.mindspore_timeout_s
    ran = run_cmd([p.python, "-c", _MS_PROBE], timeout, env=p.rank_env(), cwd=p.cwd())
    pin = "mindspore==%s" % p.mindspore_version if p.mindspore_version else "mindspore"
    install = "%s -m pip install %s" % (p.python, pin)
    fields = dict(
        line.split("=", 1) for line in ran.out.splitlines() if line.startswith("MSCON_MS_") and "=" in line
    )
    version = fields.get("MSCON_MS_VERSION")
    if version is None:
        if ran.missing or ran.error:
            why = "%s: %s" % (p.python, ran.why(timeout))
            return [result("mindspore", FAIL, why, "install Python on this node, or fix the node's python:")]
        if ran.timed_out:
            return [
                result(
                    "mindspore",
                    FAIL,
                    "import mindspore: no answer within %gs" % timeout,
                    "check the node (a hung device driver or a slow shared filesystem?)",
                    _oneline(ran.err[-2000:], 1000),
                )
            ]
        error = fields.get("MSCON_MS_ERROR") or ran.why(timeout)
        return [
            result(
                "mindspore",
                FAIL,
                "not importable: %s" % _oneline(error, 160),
                install,
                "python %s; %s" % (p.python, _oneline(error + " " + ran.err[-1500:], 1500)),
            )
        ]
    detail = "%s (python %s)" % (fields.get("MSCON_MS_FILE", ""), p.python)
    if p.mindspore_version and version != p.mindspore_version:
        return [
            result(
                "mindspore",
                FAIL,
                version,
                install,
                "expected %s; %s" % (p.mindspore_version, detail),
            )
        ]
    return [result("mindspore", OK, version, detail=detail)]


# ------------------------------------------------------------------ devices


def check_devices(p: Params) -> list:
    if p.target == "GPU":
        return check_gpu(p)
    if p.target == "Ascend":
        return check_npu(p)
    return [
        result("devices", NA, p.target, detail="no accelerator is needed for device_target %s" % p.target)
    ]


_NOT_A_NUMBER = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions)\]?$", re.I)


def _num(s: str) -> int | None:
    s = s.strip()
    if _NOT_A_NUMBER.match(s) or not s:
        return None
    m = re.match(r"^-?\d+", s)
    return int(m.group(0)) if m else None


class Gpu:
    def __init__(self, fields: list) -> None:
        self.index = _num(fields[0])
        self.uuid = fields[1].strip()
        self.name = fields[2].strip()
        self.driver = fields[3].strip()
        self.mem_used = _num(fields[4])  # MiB
        self.mem_total = _num(fields[5])
        self.util = _num(fields[6])
        self.ecc = _num(fields[7])


GPU_QUERY = (
    "--query-gpu=index,uuid,name,driver_version,memory.used,memory.total,utilization.gpu,"
    "ecc.errors.uncorrected.volatile.total"
)


def parse_gpus(text: str) -> list:
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 8 or _num(fields[0]) is None:
            continue
        if len(fields) > 8:  # a name with commas: the fixed fields are at both ends
            fields = fields[:2] + [",".join(fields[2 : len(fields) - 5])] + fields[len(fields) - 5 :]
        gpus.append(Gpu(fields))
    return gpus


def parse_gpu_apps(text: str) -> list:
    """(gpu_uuid, pid, used_mib) per compute process."""
    apps = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3:
            continue
        pid = _num(fields[1])
        if pid is None:
            continue
        apps.append((fields[0], pid, _num(fields[2])))
    return apps


def _visible(p: Params, var: str) -> tuple:
    """(raw value or None, list of entries) of a *_VISIBLE_DEVICES variable the ranks will see."""
    raw = p.env_value(var)
    if raw is None:
        return None, []
    return raw, [e.strip() for e in raw.split(",") if e.strip()]


def _visible_result(name: str, var: str, raw: str | None, entries: list, known: list, p: Params) -> tuple:
    """A result for CUDA_VISIBLE_DEVICES/ASCEND_RT_VISIBLE_DEVICES, and the device ids the ranks use."""
    count = len(known)
    want = p.devices
    if raw is None:
        use = list(range(want if want is not None else count))
        return result(name, OK, "%s not set: all %d visible" % (var, count)), use
    use = []
    bad = []
    for e in entries:
        idx = _num(e) if e.lstrip("-").isdigit() else None
        by_uuid = [i for i, k in enumerate(known) if e.startswith("GPU-") and k.startswith(e)]
        if idx is not None and 0 <= idx < count:
            use.append(idx)
        elif len(by_uuid) == 1:  # a GPU UUID, or a unique prefix of one, as CUDA accepts
            use.append(by_uuid[0])
        elif e.startswith("MIG-"):  # a MIG instance: on one of the GPUs, which one nvidia-smi -L tells
            use.append(-1)
        else:
            bad.append(e)
    where = "%s=%s" % (var, raw)
    if bad:
        return (
            result(
                name,
                FAIL,
                where,
                "give %s only ids of this node's %d devices (0..%d)" % (var, count, max(count - 1, 0)),
                "no such device: %s" % ", ".join(bad),
            ),
            use,
        )
    if want is not None and len(use) < want:
        return (
            result(
                name,
                FAIL,
                where,
                "make %s list %d devices, or set devices: %d for this node" % (var, want, len(use)),
                "%d visible, %d ranks on this node" % (len(use), want),
            ),
            use,
        )
    return result(name, OK, where), use


def check_gpu(p: Params) -> list:
    env = p.rank_env()
    tool = find_tool("nvidia-smi", env)
    if tool is None:
        return [
            result(
                "gpu.count",
                FAIL,
                "nvidia-smi not found",
                "install the NVIDIA driver on this node (or run on a node with GPUs)",
                "device_target GPU needs the NVIDIA driver; nvidia-smi is not on PATH",
            )
        ]
    ran = run_cmd([tool, GPU_QUERY, "--format=csv,noheader,nounits"], p.timeout_s, env=env)
    gpus = parse_gpus(ran.out) if ran.rc == 0 else []
    if ran.rc != 0:
        return [
            result(
                "gpu.count",
                FAIL,
                "nvidia-smi: %s" % ran.why(p.timeout_s),
                "check the NVIDIA driver on this node (nvidia-smi must answer)",
                _oneline(ran.out + " " + ran.err, 1000),
            )
        ]
    names = sorted({g.name for g in gpus})
    value = "%d x %s" % (len(gpus), "/".join(names)) if gpus else "0 GPUs"
    out = []
    if p.devices is not None and len(gpus) < p.devices:
        out.append(
            result(
                "gpu.count",
                FAIL,
                value,
                "set devices: %d for this node, or free/fix its GPUs" % len(gpus),
                "%d ranks on this node need %d GPUs; nvidia-smi lists %d" % (p.devices, p.devices, len(gpus)),
            )
        )
    elif not gpus:
        out.append(result("gpu.count", FAIL, value, "check the NVIDIA driver on this node", ran.out.strip()))
    else:
        out.append(result("gpu.count", OK, value))
    raw, entries = _visible(p, "CUDA_VISIBLE_DEVICES")
    vis, use = _visible_result("gpu.visible", "CUDA_VISIBLE_DEVICES", raw, entries, [g.uuid for g in gpus], p)
    out.append(vis)
    drivers = sorted({g.driver for g in gpus})
    if len(drivers) > 1:
        out.append(result("gpu.driver", WARN, ",".join(drivers), "one driver version per node", ""))
    else:
        out.append(result("gpu.driver", OK if drivers else NA, drivers[0] if drivers else ""))
    used = [g for g in gpus if g.index in use] if use else gpus
    out.append(_gpu_busy(p, env, tool, used))
    ecc = [g for g in used if g.ecc]
    if ecc:
        out.append(
            result(
                "gpu.ecc",
                WARN,
                ", ".join("GPU %s: %d" % (g.index, g.ecc) for g in ecc),
                "drain or reset these GPUs (nvidia-smi -q -d ECC; nvidia-smi -r -i N)",
                "uncorrected ECC errors since the driver loaded",
            )
        )
    elif used and all(g.ecc is None for g in used):
        out.append(result("gpu.ecc", NA, "ECC not reported", detail="these GPUs report no ECC counters"))
    else:
        out.append(result("gpu.ecc", OK, "0 uncorrected"))
    out.append(_gpu_xid(p, env, tool, used))
    return out


# The kernel driver's error reports: "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off
# the bus." Codes after NVIDIA's Xid catalog; these mean the GPU needs a reset or a repair, the
# others (13, 31, 43, ...) are mostly a program's faults and are only shown.
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (\d+)")
XID_NEEDS_RESET = {
    48: "double-bit ECC error",
    64: "row remapping failed",
    74: "NVLink error",
    79: "fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def _bus_key(bus: str) -> str:
    """ "00000000:3B:00.0" (nvidia-smi) and "0000:3b:00" (the kernel log) alike: "0000:3b:00"."""
    parts = bus.strip().lower().split(".")[0].split(":")
    return ":".join([parts[0][-4:]] + parts[1:]) if len(parts) == 3 else bus.strip().lower()


def kernel_log(p: Params, env: dict) -> tuple:
    """(the kernel's messages, the tool that read them), or (None, why they could not be read):
    dmesg first, then the journal (readable for the adm/systemd-journal groups where dmesg is
    restricted)."""
    why = []
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        tool = find_tool(argv[0], env)
        if tool is None:
            why.append("%s not found" % argv[0])
            continue
        ran = run_cmd([tool] + argv[1:], p.timeout_s, env=env)
        if ran.rc == 0:
            return ran.out, argv[0]
        why.append("%s: %s" % (argv[0], ran.why(p.timeout_s)))
    return None, "; ".join(why)


def _gpu_xid(p: Params, env: dict, tool: str, used: list) -> dict:
    text, how = kernel_log(p, env)
    if text is None:
        return result("gpu.xid", NA, "kernel log not readable", detail=how)
    events = _XID.findall(text)
    if not events:
        return result("gpu.xid", OK, "none in the kernel log", detail="read with %s" % how)
    ran = run_cmd([tool, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], p.timeout_s, env=env)
    index = {}
    for line in ran.out.splitlines() if ran.rc == 0 else []:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and _num(fields[0]) is not None:
            index[_bus_key(fields[1])] = _num(fields[0])
    ours = {g.index for g in used}
    counts: dict = {}  # (label, code) -> how many
    for bus, code in events:
        gpu = index.get(_bus_key(bus))
        if gpu is not None and gpu not in ours:
            continue  # a GPU the ranks do not use
        label = "GPU %d" % gpu if gpu is not None else "PCI %s" % bus
        key = (label, int(code))
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return result("gpu.xid", OK, "none on the GPUs the ranks use", detail="read with %s" % how)
    shown = []
    for (label, code), n in sorted(counts.items()):
        what = XID_NEEDS_RESET.get(code)
        shown.append(
            "%s: Xid %d%s%s" % (label, code, " (%s)" % what if what else "", " x%d" % n if n > 1 else "")
        )
    detail = "since boot, read with %s; NVIDIA's Xid catalog explains each code" % how
    if any(code in XID_NEEDS_RESET for _, code in counts):
        return result(
            "gpu.xid",
            FAIL,
            "; ".join(shown),
            "reset or drain that GPU (nvidia-smi -r -i N, or reboot); the kernel log keeps Xids until a "
            "reboot: once it is fixed, --skip-check gpu.xid",
            detail,
        )
    return result(
        "gpu.xid", WARN, "; ".join(shown), "see the kernel log (dmesg) for what the GPU reported", detail
    )


def _gpu_busy(p: Params, env: dict, tool: str, used: list) -> dict:
    ran = run_cmd(
        [tool, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader"], p.timeout_s, env=env
    )
    by_uuid = {g.uuid: g for g in used}
    procs = []
    if ran.rc == 0:
        for uuid, pid, mib in parse_gpu_apps(ran.out):
            g = by_uuid.get(uuid)
            if g is None:
                continue
            procs.append(
                "GPU %s: pid %d %s(%s)" % (g.index, pid, _proc_name(pid), "%s MiB" % mib if mib else "?")
            )
    # Processes of other containers are not listed; their memory shows.
    hidden = [
        g
        for g in used
        if g.mem_used is not None
        and g.mem_total
        and g.mem_used > max(1024, g.mem_total // 10)
        and not any(s.startswith("GPU %s:" % g.index) for s in procs)
    ]
    for g in hidden:
        procs.append(
            "GPU %s: %d of %d MiB in use by processes not visible here" % (g.index, g.mem_used, g.mem_total)
        )
    if procs:
        return result(
            "gpu.busy",
            WARN,
            "%d in use" % len({s.split(":")[0] for s in procs}),
            "stop those processes, or point CUDA_VISIBLE_DEVICES at free GPUs",
            "; ".join(procs),
        )
    if ran.rc != 0:
        return result("gpu.busy", NA, "compute apps: %s" % ran.why(p.timeout_s))
    return result("gpu.busy", OK, "idle")


def _proc_name(pid: int) -> str:
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip() + " "
    except OSError:
        return ""


# npu-smi info ---------------------------------------------------------


_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_NPU_ROW = re.compile(r"^(\d+)\s+(\S.*)$")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")


class Npu:
    def __init__(self, npu: int, name: str, health: str) -> None:
        self.npu = npu
        self.name = name
        self.health = health
        self.chip = 0
        self.phy: int | None = None  # Phy-ID, where npu-smi shows one (several chips per NPU)
        self.bus = ""
        self.hbm_used: int | None = None
        self.hbm_total: int | None = None

    @property
    def label(self) -> str:
        return "NPU %d chip %d" % (self.npu, self.chip)

    @property
    def hccn_id(self) -> int:
        """The id hccn_tool -i takes: the NPU id (the chip's Phy-ID where an NPU has several)."""
        return self.phy if self.phy is not None else self.npu


def parse_npu_smi(text: str) -> tuple:
    """(version, [Npu per chip, in order: the logical device ids], [(npu, chip, pid, name)])."""
    version = ""
    chips: list = []
    procs: list = []
    section = ""
    pending: Npu | None = None
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("|"):
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if not version:
            m = re.search(r"Version:\s*(\S+)", s)
            if m:
                version = m.group(1)
                continue
        if len(cells) >= 2 and cells[0].startswith("NPU") and "Name" in cells[0]:
            section = "devices"
            continue
        if cells[0].startswith("NPU") and any(c.startswith("Process id") for c in cells):
            section = "procs"
            continue
        if section == "devices" and len(cells) >= 2:
            if _BUS_ID.match(cells[1]):
                if pending is not None:
                    ids = cells[0].split()
                    pending.chip = int(ids[0]) if ids and ids[0].isdigit() else 0
                    if len(ids) > 1 and ids[1].isdigit():
                        pending.phy = int(ids[1])
                    pending.bus = cells[1]
                    pairs = _PAIR.findall(cells[2]) if len(cells) > 2 else []
                    if pairs:
                        pending.hbm_used, pending.hbm_total = int(pairs[-1][0]), int(pairs[-1][1])
                    chips.append(pending)
                    pending = None
                continue
            m = _NPU_ROW.match(cells[0])
            if m:
                pending = Npu(int(m.group(1)), m.group(2).strip(), cells[1])
        elif section == "procs" and len(cells) >= 4:
            ids = cells[0].split()
            if len(ids) >= 2 and ids[0].isdigit() and ids[1].isdigit() and cells[1].isdigit():
                procs.append((int(ids[0]), int(ids[1]), int(cells[1]), cells[2]))
    return version, chips, procs


def check_npu(p: Params) -> list:
    env = p.rank_env()
    tool = find_tool("npu-smi", env)
    if tool is None:
        return [
            result(
                "npu.count",
                FAIL,
                "npu-smi not found",
                "install the Ascend driver on this node (npu-smi comes with it)",
                "device_target Ascend needs the Ascend driver; npu-smi is not on PATH",
            )
        ]
    ran = run_cmd([tool, "info"], p.timeout_s, env=env)
    if ran.rc != 0:
        return [
            result(
                "npu.count",
                FAIL,
                "npu-smi info: %s" % ran.why(p.timeout_s),
                "check the Ascend driver on this node (npu-smi info must answer)",
                _oneline(ran.out + " " + ran.err, 1000),
            )
        ]
    version, chips, procs = parse_npu_smi(ran.out)
    names = sorted({c.name for c in chips})
    value = "%d x %s" % (len(chips), "/".join(names)) if chips else "0 NPUs"
    out = []
    if p.devices is not None and len(chips) < p.devices:
        out.append(
            result(
                "npu.count",
                FAIL,
                value,
                "set devices: %d for this node, or fix its NPUs" % len(chips),
                "%d ranks on this node need %d NPUs; npu-smi info lists %d"
                % (p.devices, p.devices, len(chips)),
            )
        )
    elif not chips:
        out.append(
            result("npu.count", FAIL, value, "check the Ascend driver on this node", _oneline(ran.out, 1000))
        )
    else:
        out.append(result("npu.count", OK, value))
    raw, entries = _visible(p, "ASCEND_RT_VISIBLE_DEVICES")
    ids = [str(i) for i in range(len(chips))]  # logical ids, in npu-smi's order
    vis, use = _visible_result("npu.visible", "ASCEND_RT_VISIBLE_DEVICES", raw, entries, ids, p)
    out.append(vis)
    out.append(result("npu.driver", OK if version else NA, version))
    used = [c for i, c in enumerate(chips) if i in use] if use else chips
    bad = [c for c in used if c.health.upper() != "OK"]
    if bad:
        serious = any(c.health.lower() not in ("warning",) for c in bad)
        out.append(
            result(
                "npu.health",
                FAIL if serious else WARN,
                ", ".join("%s: %s" % (c.label, c.health) for c in bad),
                "see npu-smi info -t health -i N; drain the node or replace the NPU",
                "Health is OK, Warning (minor), Alarm (major) or Critical",
            )
        )
    else:
        out.append(result("npu.health", OK if used else NA, "OK" if used else ""))
    keys = {(c.npu, c.chip) for c in used}
    busy = ["NPU %d chip %d: pid %d %s" % (n, c, pid, name) for n, c, pid, name in procs if (n, c) in keys]
    if busy:
        out.append(
            result(
                "npu.busy",
                WARN,
                "%d in use" % len({b.split(":")[0] for b in busy}),
                "stop those processes, or point ASCEND_RT_VISIBLE_DEVICES at free NPUs",
                "; ".join(busy),
            )
        )
    else:
        out.append(result("npu.busy", OK, "idle"))
    out.extend(_hccn(p, env, [c.hccn_id for c in used]))
    return out


def _hccn(p: Params, env: dict, ids: list) -> list:
    """NPU network ports (RoCE), used by HCCL across nodes."""
    if p.nodes == 1:
        why = "a single-node job: HCCL does not use the NPU network ports"
        return [result("npu.link", NA, detail=why), result("npu.net", NA, detail=why)]
    tool = find_tool("hccn_tool", env)
    if tool is None:
        why = "hccn_tool not found (it comes with the Ascend driver, under /usr/local/Ascend/driver/tools)"
        return [result("npu.link", NA, "hccn_tool not found", detail=why), result("npu.net", NA, detail=why)]
    answers: dict = {}

    def ask(i: int, what: str) -> None:
        answers[(i, what)] = run_cmd([tool, "-i", str(i), "-" + what, "-g"], p.timeout_s, env=env)

    threads = [
        threading.Thread(target=ask, args=(i, w), daemon=True) for i in ids for w in ("link", "net_health")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    down, link_err, unhealthy, net_err = [], [], [], []
    for i in ids:
        ran = answers[(i, "link")]
        m = re.search(r"link status\s*:\s*(\S+)", ran.out, re.I)
        if ran.rc != 0 or not m:
            link_err.append(
                "device %d: %s" % (i, ran.why(p.timeout_s) if ran.rc != 0 else _oneline(ran.out, 80))
            )
        elif m.group(1).upper() != "UP":
            down.append("device %d: %s" % (i, m.group(1)))
        ran = answers[(i, "net_health")]
        m = re.search(r"net health status\s*:\s*(.+)", ran.out, re.I)
        if ran.rc != 0 or not m:
            net_err.append(
                "device %d: %s" % (i, ran.why(p.timeout_s) if ran.rc != 0 else _oneline(ran.out, 80))
            )
        elif m.group(1).strip().lower() != "success":
            unhealthy.append("device %d: %s" % (i, m.group(1).strip()))
    out = []
    if down:
        out.append(
            result(
                "npu.link",
                FAIL,
                "; ".join(down),
                "check the NPU ports' cables and switch (hccn_tool -i N -link -g)",
                "HCCL across nodes needs every NPU port up",
            )
        )
    elif link_err:
        out.append(result("npu.link", WARN, "; ".join(link_err), "check hccn_tool on this node"))
    else:
        out.append(
            result("npu.link", OK, "%d up" % len(ids) if ids else "", detail="hccn_tool -i N -link -g")
        )
    if unhealthy:
        out.append(
            result(
                "npu.net",
                WARN,
                "; ".join(unhealthy),
                "check the NPU network (hccn_tool -i N -net_health -g; -netdetect -g; -ip -g)",
                "net health other than Success: the detect IP does not answer over the NPU network",
            )
        )
    elif net_err:
        out.append(result("npu.net", WARN, "; ".join(net_err), "check hccn_tool on this node"))
    else:
        out.append(result("npu.net", OK, "Success" if ids else "", detail="hccn_tool -i N -net_health -g"))
    return out


# ------------------------------------------------------------------ shm, limits, disk


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def check_shm(p: Params) -> list:
    path = p.shm_path
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return [
            result(
                "shm",
                FAIL,
                "%s: %s" % (path, exc.strerror or exc),
                "mount a tmpfs at %s (mount -t tmpfs -o size=%dg tmpfs %s)"
                % (path, max(1, math.ceil(p.shm_min_gib)), path),
            )
        ]
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    value = "%s free of %s" % (_size(free), _size(total))
    need = p.shm_min_gib * GIB
    if free >= need:
        return [result("shm", OK, value, detail="%s; at least %g GiB wanted" % (path, p.shm_min_gib))]
    want = max(1, math.ceil((total - free) / GIB + p.shm_min_gib))
    detail = "%s has %s free, below shm_min_gib %g" % (path, _size(free), p.shm_min_gib)
    if total <= DOCKER_SHM_DEFAULT:
        detail += "; 64 MiB is the default /dev/shm of a Docker container"
    remedy = (
        "give the container a bigger /dev/shm (docker run --shm-size=%dg; Kubernetes: an emptyDir with "
        "medium: Memory at /dev/shm) or on the host: mount -o remount,size=%dG %s" % (want, want, path)
    )
    if total - free > need:  # big enough, but full: leftovers of earlier runs
        remedy = "free %s (stale files of earlier runs?), or enlarge it: mount -o remount,size=%dG %s" % (
            path,
            want,
            path,
        )
    return [result("shm", FAIL, value, remedy, detail)]


def _limit_str(v: int) -> str:
    return "unlimited" if v == resource.RLIM_INFINITY else str(v)


def check_limits(p: Params) -> list:
    out = []
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    value = "%s (hard %s)" % (
        _limit_str(soft) if soft == resource.RLIM_INFINITY else _size(soft),
        _limit_str(hard) if hard == resource.RLIM_INFINITY else _size(hard),
    )
    if soft == resource.RLIM_INFINITY:
        out.append(result("limits.memlock", OK, value))
    elif p.target in ("GPU", "Ascend"):
        out.append(
            result(
                "limits.memlock",
                WARN,
                value,
                "raise it to unlimited: memlock - unlimited in /etc/security/limits.conf "
                "(docker: --ulimit memlock=-1)",
                "ulimit -l; RDMA and pinned host memory (NCCL/HCCL) need locked memory",
            )
        )
    else:
        out.append(result("limits.memlock", OK, value, detail="ulimit -l; not limiting on CPU"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    value = "%s (hard %s)" % (_limit_str(soft), _limit_str(hard))
    if soft != resource.RLIM_INFINITY and soft < NOFILE_MIN:
        out.append(
            result(
                "limits.nofile",
                WARN,
                value,
                "raise it to %d or more: nofile in /etc/security/limits.conf (docker: --ulimit nofile=%d:%d)"
                % (NOFILE_MIN, NOFILE_MIN, NOFILE_MIN),
                "ulimit -n; data loaders and many ranks open many files and sockets",
            )
        )
    else:
        out.append(result("limits.nofile", OK, value))
    return out


def check_disk(p: Params) -> list:
    paths = [("disk.workdir", p.workdir or os.path.expanduser("~"))]
    if p.checkpoint_dir:
        paths.append(("disk.checkpoint_dir", p.checkpoint_dir))
    out = []
    for name, path in paths:
        where = _nearest_existing(path)
        try:
            st = os.statvfs(where)
        except OSError as exc:
            out.append(
                result(name, FAIL, "%s: %s" % (path, exc.strerror or exc), "check %s on this node" % path)
            )
            continue
        free = st.f_bavail * st.f_frsize
        value = "%s free" % _size(free)
        detail = (
            path
            if where == os.path.abspath(os.path.expanduser(path))
            else "%s (not there yet: %s)" % (path, where)
        )
        if free < p.disk_min_gib * GIB:
            out.append(
                result(
                    name,
                    FAIL,
                    value,
                    "free space on %s, or point it at a bigger disk" % where,
                    "%s; at least %g GiB wanted" % (detail, p.disk_min_gib),
                )
            )
        else:
            out.append(result(name, OK, value, detail=detail))
    return out


# ------------------------------------------------------------------ port


def check_port(p: Params) -> list:
    if not p.is_first:
        return [result("port", NA, detail="the scheduler runs on the first node")]
    port = p.sched_port
    if port is None or not 0 < port < 65536:
        return [result("port", NA, detail="no scheduler port given")]
    hosts = ["0.0.0.0"]
    if p.sched_host and p.sched_host not in hosts:
        hosts.append(p.sched_host)
    for host in hosts:
        try:
            infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            return [
                result(
                    "port",
                    FAIL,
                    "%s does not resolve" % host,
                    "give scheduler.host as an IP address of the first node",
                    str(exc),
                )
            ]
        for family, kind, proto, _canon, addr in infos[:1]:
            err = _try_bind(family, kind, proto, addr)
            if err is None:
                continue
            if err.errno == errno.EADDRINUSE:
                holder = port_holder(port)
                return [
                    result(
                        "port",
                        FAIL,
                        "%d in use%s" % (port, " by " + holder if holder else ""),
                        "choose another scheduler.port, or stop the process holding %d" % port,
                        "binding %s:%d: %s" % (addr[0], port, err.strerror),
                    )
                ]
            if err.errno == errno.EADDRNOTAVAIL:
                return [
                    result(
                        "port",
                        WARN,
                        "%s is not an address of this node" % addr[0],
                        "set scheduler.host (or the first node's address) to an IP of this node",
                        "MindSpore's scheduler binds MS_SCHED_HOST:%d; it would fail here" % port,
                    )
                ]
            return [
                result(
                    "port", FAIL, "%s:%d: %s" % (addr[0], port, err.strerror), "choose another scheduler.port"
                )
            ]
    return [result("port", OK, "%d free" % port, detail="bound on %s" % ", ".join(hosts))]


def _try_bind(family: int, kind: int, proto: int, addr: tuple) -> OSError | None:
    s = socket.socket(family, kind, proto)
    try:
        # As servers do: a TIME_WAIT left by the last run is no obstacle, a listener is.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen(1)
        return None
    except OSError as exc:
        return exc
    finally:
        s.close()


def port_holder(port: int) -> str:
    """'pid 1234 (python3 ...)' of the process listening on the TCP port, where it can be told."""
    pid = None
    psutil = psutil_module()  # optional on nodes: without it /proc is read
    if psutil is not None:
        try:
            for c in psutil.net_connections(kind="inet"):
                if c.laddr and c.laddr[1] == port and c.status == psutil.CONN_LISTEN and c.pid:
                    pid = c.pid
                    break
        except Exception:  # AccessDenied on some systems: try /proc
            pid = None
    if pid is None:
        pid = _proc_port_holder(port)
    if pid is None:
        return ""
    return "pid %d (%s)" % (pid, _describe_pid(pid))


def _describe_pid(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        if cmd:
            return _oneline(cmd, 120)
    except OSError:
        pass
    return _proc_name(pid).strip() or "?"


def _proc_port_holder(port: int) -> int | None:
    """The pid owning a listening socket on the port, via /proc/net/tcp{,6} and /proc/*/fd."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[3] != "0A":  # 0A: TCP_LISTEN
                        continue
                    if int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except (OSError, ValueError, IndexError):
            continue
    if not inodes:
        return None
    targets = {"socket:[%s]" % i for i in inodes}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in targets:
                    return pid
            except OSError:
                continue
    return None


# ------------------------------------------------------------------ ifname


def interfaces() -> dict:
    """name -> True when up (IFF_UP set and operstate not down), from /sys/class/net."""
    out = {}
    try:
        names = sorted(os.listdir(_SYS_NET))
    except OSError:
        return out
    for name in names:
        base = os.path.join(_SYS_NET, name)
        state = _read(os.path.join(base, "operstate")).lower()
        flags = _read(os.path.join(base, "flags"))
        try:
            admin_up = bool(int(flags, 16) & _IFF_UP) if flags else state == "up"
        except ValueError:
            admin_up = state == "up"
        out[name] = admin_up and state in ("up", "unknown")
    return out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def match_ifname(spec: str, names: list, prefix_match: bool = True) -> tuple:
    """The interfaces an NCCL-style *_SOCKET_IFNAME selects, and the entries that match nothing.

    NCCL: a comma list of prefixes (``eth``: eth0, eth1...), ``=`` before the list for exact
    names, ``^`` before it to exclude instead (``^docker``, ``^=docker0``)."""
    s = spec.strip()
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    exact = s.startswith("=") or not prefix_match
    if s.startswith("="):
        s = s[1:]
    entries = [e.strip() for e in s.split(",") if e.strip()]

    def hits(entry: str) -> list:
        return [n for n in names if (n == entry if exact else n.startswith(entry))]

    unmatched = [e for e in entries if not hits(e)]
    matched = {n for e in entries for n in hits(e)}
    if exclude:
        return [n for n in names if n not in matched and n != "lo"], unmatched, True
    return [n for n in names if n in matched], unmatched, False


def check_ifname(p: Params) -> list:
    out = []
    ifs = interfaces()
    names = sorted(ifs)
    listing = ", ".join("%s (%s)" % (n, "up" if ifs[n] else "down") for n in names) or "none"
    relevant = {"NCCL_SOCKET_IFNAME": ("GPU",), "HCCL_SOCKET_IFNAME": ("Ascend",)}
    for var in IFNAME_VARS:
        spec = p.env_value(var)
        if spec is None:
            continue
        name = "ifname." + var
        bad = FAIL if p.target in relevant.get(var, ("GPU", "Ascend", "CPU")) else WARN
        if not spec.strip():
            out.append(result(name, WARN, "%s is empty" % var, "unset %s or name an interface" % var))
            continue
        # Gloo takes exact names; NCCL and HCCL prefixes with the =/^ forms.
        selected, unmatched, exclude = match_ifname(spec, names, prefix_match=var != "GLOO_SOCKET_IFNAME")
        up = [n for n in selected if ifs.get(n)]
        value = "%s=%s" % (var, spec)
        remedy = "set %s to an interface of this node that is up" % var
        if not up:
            why = (
                "excludes every interface that is up"
                + (" but lo (no way to other nodes)" if ifs.get("lo") else "")
                if exclude
                else (
                    "no interface %s" % ", ".join(unmatched) if unmatched else "%s down" % ", ".join(selected)
                )
            )
            out.append(result(name, bad, value, remedy, "%s; this node has: %s" % (why, listing)))
        elif unmatched and not exclude:
            out.append(
                result(
                    name,
                    WARN,
                    value,
                    remedy,
                    "no interface %s (using %s); this node has: %s"
                    % (", ".join(unmatched), ", ".join(up), listing),
                )
            )
        else:
            out.append(result(name, OK, value, detail="selects %s" % ", ".join(up)))
    if not out:
        out.append(
            result(
                "ifname",
                NA,
                "none set",
                detail="the libraries choose the interface; this node has: " + listing,
            )
        )
    return out


# ------------------------------------------------------------------ env, clock


def check_env(p: Params) -> list:
    out = []
    left = ["%s=%s" % (k, os.environ[k]) for k in LEFTOVER_VARS if k in os.environ]
    if left:
        out.append(
            result(
                "env.leftover",
                WARN,
                ", ".join(k.split("=", 1)[0] for k in left),
                "unset them in the node's login environment (~/.bashrc, /etc/environment, container env)",
                "set in the node's own environment: %s; another launcher's settings leak into the ranks "
                "(a known cause of 'Address already in use' under container orchestrators)" % "; ".join(left),
            )
        )
    else:
        out.append(result("env.leftover", OK, "none"))
    merged = dict(os.environ)
    merged.update(p.job_env)
    disabled = sorted(
        "%s=%s" % (k, v)
        for k, v in merged.items()
        if k.startswith("NCCL_") and k.endswith("_DISABLE") and v.strip() not in ("", "0")
    )
    if disabled:
        out.append(
            result(
                "env.nccl_disable",
                WARN,
                ", ".join(d.split("=", 1)[0] for d in disabled),
                "unset them unless you mean to (each turns off a fast path: IB, P2P, SHM...)",
                "; ".join(disabled),
            )
        )
    else:
        out.append(result("env.nccl_disable", OK, "none"))
    out.append(_timeouts(p))
    out.append(_rank_table(p))
    return out


_RANK_TABLE_MAX = 16 * 1024 * 1024


def _rank_table(p: Params) -> dict:
    """An Ascend rank table (RANK_TABLE_FILE, static networking) must list exactly the job's ranks:
    HCCL otherwise fails, or waits for ranks that never come, at the first collective."""
    path = p.env_value("RANK_TABLE_FILE")
    if not path:
        return result("env.rank_table", NA, "none", detail="RANK_TABLE_FILE is not set (dynamic networking)")
    fix = "regenerate the rank table for these nodes and devices, or unset RANK_TABLE_FILE (mscon needs none)"
    try:
        with open(path, "rb") as f:
            data = f.read(_RANK_TABLE_MAX + 1)
        if len(data) > _RANK_TABLE_MAX:
            raise ValueError("larger than 16 MiB")
        doc = json.loads(data)
        servers = doc["server_list"]
        ranks = [str(d.get("rank_id", "")).strip() for s in servers for d in s["device"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = (
            exc.strerror
            if isinstance(exc, OSError) and exc.strerror
            else "%s: %s" % (type(exc).__name__, exc)
        )
        return result("env.rank_table", FAIL, "unreadable: %s" % _oneline(str(why), 160), fix, path)
    problems = []
    if p.world_size is not None and len(ranks) != p.world_size:
        problems.append("it lists %d devices, the inventory launches %d ranks" % (len(ranks), p.world_size))
    want = [str(i) for i in range(len(ranks))]
    if sorted(ranks, key=lambda r: (len(r), r)) != want:
        problems.append("its rank_id values are not 0..%d, each once" % (len(ranks) - 1))
    count = doc.get("server_count")
    if count is not None and str(count).strip() != str(len(servers)):
        problems.append("server_count %s but %d servers listed" % (count, len(servers)))
    if problems:
        return result("env.rank_table", FAIL, "; ".join(problems), fix, path)
    status = str(doc.get("status", "completed"))
    if status != "completed":
        return result(
            "env.rank_table",
            WARN,
            "status %r" % status,
            "HCCL reads only a rank table whose status is completed",
            path,
        )
    return result("env.rank_table", OK, "%d devices on %d servers" % (len(ranks), len(servers)), detail=path)


def _timeouts(p: Params) -> dict:
    values = []
    given = set()
    bad = []
    for var, default in TIMEOUT_ORDER:
        raw = p.env_value(var)
        if raw is None:
            values.append((var, default))
            continue
        try:
            values.append((var, int(float(raw.strip()))))
            given.add(var)
        except ValueError:
            bad.append("%s=%r is not a number of seconds" % (var, raw))
            values.append((var, default))
    if not given and not bad:
        return result("env.timeouts", NA, "defaults", detail=", ".join("%s=%d" % vd for vd in values))
    wrong = []
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            (a, va), (b, vb) = values[i], values[j]
            if (a in given or b in given) and va >= vb:
                wrong.append(
                    "%s (%d s%s) should be below %s (%d s%s)"
                    % (a, va, "" if a in given else ", default", b, vb, "" if b in given else ", default")
                )
    shown = ", ".join("%s=%d" % (v, s) for v, s in values if v in given)
    if bad or wrong:
        return result(
            "env.timeouts",
            WARN,
            shown or "invalid",
            "keep %s" % " < ".join(v for v, _ in TIMEOUT_ORDER),
            "; ".join(bad + wrong) + ": a timeout meant to fire later would fire first and hide the cause",
        )
    return result("env.timeouts", OK, shown, detail=" < ".join("%s=%d" % vd for vd in values))


def check_clock(p: Params) -> list:
    now = p.received_ns
    if p.console_time_ns is None:
        return [result("clock", OK, str(now), detail="this node's time.time_ns() when the request arrived")]
    offset_ms = (now - p.console_time_ns) / 1e6
    return [
        result(
            "clock",
            OK,
            str(now),
            detail="%+.1f ms from the console's clock (includes the message's travel time)" % offset_ms,
        )
    ]


_CHECKS = {
    "python": check_python,
    "mindspore": check_mindspore,
    "devices": check_devices,
    "shm": check_shm,
    "limits": check_limits,
    "disk": check_disk,
    "port": check_port,
    "ifname": check_ifname,
    "env": check_env,
    "clock": check_clock,
}
