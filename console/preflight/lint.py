"""The job's arguments, checked by the trainer's own config checks (``trainer/config.py``) in a
subprocess: they report by printing and exiting, and the job's trainer should not be imported into
the console."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib import resources
from pathlib import Path, PurePosixPath

from mscon.console.config.inventory import Inventory
from mscon.console.engine.events import CheckReported, CheckStatus
from mscon.console.engine.job_kinds import is_trainer
from mscon.console.preflight import checks as cc

_LINT_TIMEOUT_S = 30.0

_LINT_PROGRAM = """
import contextlib, io, json, sys
root, mode, argv, size = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, root)
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        from trainer import config
        if mode == "trainer":
            config.parse_args(argv, config.Cluster(in_cluster=True, is_scheduler=False, size=size))
        else:
            config.normalise_mode(argv[0])
except SystemExit as exc:
    print(json.dumps({"ok": False, "code": exc.code, "error": err.getvalue()}))
except Exception as exc:
    print(json.dumps({"ok": False, "why": "cannot load %s/trainer/config.py: %s" % (root, exc)}))
else:
    print(json.dumps({"ok": True}))
"""


async def lint(inv: Inventory, script: str, args: tuple[str, ...], args_given: bool) -> CheckReported:
    """The trainer's own argument checks with the inventory's world size; for other scripts,
    only whether a parallel mode they are given is one of MindSpore's. ``args_given``: the
    arguments came after -- (else they are the inventory's job.args)."""
    where = "the arguments after --" if args_given else f"job.args of {inv.path}"
    path = PurePosixPath(script.replace("\\", "/"))
    if is_trainer(script):
        root = str((inv.job.workdir / path).parent.parent)
        size = inv.world_size
        mode, argv, subject = "trainer", list(args), f"{path} for {size} rank(s)"
    else:
        value = cc.parallel_mode_arg(args)
        if value is None:
            return cc.result(cc.ALL, "config", CheckStatus.NA, "no parallel mode given", "", str(path))
        # The product's own copy of the trainer's config: its mode names and hints.
        root = str(Path(str(resources.files("mscon.trainer"))).parent)
        mode, argv, subject = "mode", [value], f"parallel mode {value!r}"
    try:
        # -I: with plain -c the folder mscon was started in comes first on sys.path, so a json.py
        # or hmac.py there would run in this interpreter (and no PYTHON* variable steers it).
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-c",
            _LINT_PROGRAM,
            root,
            mode,
            json.dumps(argv),
            str(inv.world_size),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), _LINT_TIMEOUT_S)
        lines = out.decode("utf-8", "replace").strip().splitlines()
        answer = json.loads(lines[-1]) if lines else {"why": err.decode("utf-8", "replace")[-300:]}
    except (OSError, ValueError, TimeoutError) as exc:
        answer = {"why": f"{type(exc).__name__}: {exc}"}
    return cc.config_result(answer, subject, where)
