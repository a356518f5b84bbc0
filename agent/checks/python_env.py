"""``python`` and ``mindspore``: the ranks' Python starts, and imports MindSpore with the ranks'
environment (its bare version reported for the console to compare across nodes)."""

from __future__ import annotations

import os
import shutil
import sys

from .params import Params
from .results import FAIL, OK, oneline, result
from .tools import run_cmd

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
                oneline(ran.err or ran.out, 1000),
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
                    oneline(ran.err[-2000:], 1000),
                )
            ]
        error = fields.get("MSCON_MS_ERROR") or ran.why(timeout)
        return [
            result(
                "mindspore",
                FAIL,
                "not importable: %s" % oneline(error, 160),
                install,
                "python %s; %s" % (p.python, oneline(error + " " + ran.err[-1500:], 1500)),
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
