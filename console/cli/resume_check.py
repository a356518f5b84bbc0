"""``mscon check --resume [--at STEP] [INVENTORY] -- train.py ARGS``: does the script resume exactly?

On this machine (no node given, or an inventory of local nodes only): runs ``python -m
mscon_resume.check`` (uninterrupted, killed at a step, relaunched with ``MSCON_RESUME=1``,
compared) with the job's Python and passes its verdict and exit code on. On the cluster's nodes (an
inventory naming remote nodes, ``--hosts``, ``--hostfile``, ``--slurm``): resume_check_nodes.py,
through mscon's own engine.
"""

from __future__ import annotations

import argparse
import enum
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from mscon.console.cli.exit_table import resume_check_codes_text
from mscon.console.cli.usage import usage_error
from mscon.console.config.inventory import InventoryError, load_inventory
from mscon.console.engine import exit_codes


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a step, 1 or more, got {text!r}")
    return value


def add_resume_flags(check: argparse.ArgumentParser) -> None:
    g = check.add_argument_group("--resume: does the script resume exactly? (here, or on the nodes given)")
    g.add_argument(
        "--resume",
        action="store_true",
        help="run the script after -- uninterrupted, killed at a step and relaunched with MSCON_RESUME=1, "
        "and compare the relaunch with the uninterrupted run (ranks: --nproc-per-node, default 1). "
        f"Exit codes: {resume_check_codes_text()}",
    )
    g.add_argument(
        "--at",
        type=_step,
        metavar="STEP",
        help="with --resume: kill the second run at this step (default: 40%% of it)",
    )
    g.add_argument(
        "--keep-dir",
        type=Path,
        metavar="DIR",
        help="with --resume: keep the runs (on nodes: their fetched run folders) in DIR (default: a "
        "temp folder, removed)",
    )


def resume_check_main(args: argparse.Namespace, user_cmd: list[str] | None) -> int:
    """The check's exit code (``RESUME_CHECK_CODES``), or 2 after a one-line error."""
    if not args.resume:
        return usage_error("--at, --keep-dir: only with --resume")
    where = _where(args)
    if isinstance(where, int):
        return where
    if where is Where.NODES:
        from mscon.console.cli.resume_check_nodes import resume_check_nodes

        return resume_check_nodes(args, user_cmd)
    if not user_cmd:
        return usage_error(
            "--resume: give the script after --, e.g. mscon check --resume -- train.py --epochs 1"
        )
    if not Path(user_cmd[0]).is_file():
        return usage_error(f"script {user_cmd[0]}: no such file")
    job = _job_here(args)
    if isinstance(job, int):
        return job
    python, env, nproc = job
    cmd = [python, "-c", _CHECK_BOOT, "--nproc", str(nproc)]
    if args.at is not None:
        cmd += ["--at", str(args.at)]
    if args.keep_dir is not None:
        cmd += ["--keep-dir", str(args.keep_dir)]
    for key, value in env.items():
        cmd += ["--env", f"{key}={value}"]
    try:
        return subprocess.run([*cmd, "--", *user_cmd], env=_with_library(), check=False).returncode
    except FileNotFoundError:
        return usage_error(f"--python {python}: no such interpreter")
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED


# ``python -m mscon_resume.check`` less the folder mscon was started in: ``-m`` puts it first on
# sys.path, where a planted json.py or hmac.py would run. Not ``-I``: the job's Python may predate
# ``-P``, and the library comes through PYTHONPATH (_with_library).
_CHECK_BOOT = (
    "import sys;sys.path[:]=[p for p in sys.path if p];import runpy;"
    "runpy.run_module('mscon_resume.check',run_name='__main__',alter_sys=True)"
)


class Where(enum.Enum):
    HERE = "here"  # python -m mscon_resume.check on this machine
    NODES = "nodes"  # through mscon's engine (resume_check_nodes.py)


def _where(args: argparse.Namespace) -> Where | int:
    """Where the check runs: on the cluster's nodes with node flags, Slurm, or an inventory naming
    a node that is not this machine (an exit code after the inventory's errors)."""
    if args.hosts is not None or args.hostfile is not None or args.slurm:
        return Where.NODES
    if args.inventory is None:
        return Where.HERE
    try:
        inv = load_inventory(args.inventory)
    except InventoryError as exc:
        print(exc.report(), file=sys.stderr)
        return exit_codes.USAGE
    remote = inv.slurm is not None or any(n.transport != "local" for n in inv.nodes)
    return Where.NODES if remote else Where.HERE


def _job_here(args: argparse.Namespace) -> tuple[str, dict[str, str], int] | int:
    """(python, environment, ranks) from the inventory (its local nodes) and the flags."""
    env: dict[str, str] = {}
    python, nproc = None, 1
    if args.inventory is not None:
        try:
            inv = load_inventory(args.inventory)
        except InventoryError as exc:
            print(exc.report(), file=sys.stderr)
            return exit_codes.USAGE
        python = next((n.python for n in inv.nodes if n.python), None)
        env.update(inv.job.env)
        for node in inv.nodes:
            env.update(node.env)
        nproc = sum(n.devices for n in inv.nodes) or 1
    for item in args.env:
        key, eq, value = item.partition("=")
        if not eq or not key:
            return usage_error(f"--env {item}: expected KEY=VALUE")
        env[key] = value
    if args.nproc_per_node is not None:
        if args.nproc_per_node < 1:
            return usage_error("--nproc-per-node: 1 or more")
        nproc = args.nproc_per_node
    return args.python or python or sys.executable, env, nproc


def _with_library() -> dict[str, str]:
    """This environment, with the console's own ``mscon_resume`` first on the path: the job's
    Python may not have mscon installed."""
    env = dict(os.environ)
    spec = importlib.util.find_spec("mscon_resume")
    if spec is not None and spec.origin:
        root = str(Path(spec.origin).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
