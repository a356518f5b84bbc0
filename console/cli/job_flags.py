"""The flags that give a job without an inventory file (``--hosts``, ``--hostfile``,
``--nproc-per-node``, ...), shared by ``mscon run``/``up``, ``check`` and ``init``."""

from __future__ import annotations

import argparse
from pathlib import Path

from mscon.console.config.adhoc import AdhocFlags, device_target_arg


def _device_target(text: str) -> str:
    try:
        return device_target_arg(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_adhoc_flags(p: argparse.ArgumentParser) -> None:
    """The flags that describe a job without an inventory file (as msrun, torchrun and mpirun take
    them); all but the node flags also apply over an inventory (console/config/adhoc.py)."""
    g = p.add_argument_group("without an inventory (or over one)")
    g.add_argument(
        "--hosts",
        metavar="HOST,HOST",
        help="the nodes, reached over SSH as `ssh HOST` reaches them (~/.ssh/config aliases too); "
        "the first runs MindSpore's scheduler; no INVENTORY then",
    )
    g.add_argument(
        "--hostfile",
        metavar="FILE",
        type=Path,
        help="the nodes from an MPI/DeepSpeed hostfile: HOST [slots=N] per line (slots: its ranks)",
    )
    g.add_argument(
        "--nproc-per-node", type=int, metavar="N", help="ranks per node (with --hosts; a hostfile's default)"
    )
    g.add_argument(
        "--device-target",
        type=_device_target,
        metavar="GPU|Ascend|CPU",
        help="the devices the ranks use (with --hosts, default CPU: no device checks)",
    )
    g.add_argument("--python", metavar="PATH", help="the interpreter with MindSpore on every node")
    g.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a variable in every rank's environment (repeatable; the laptop's is not sent)",
    )
    g.add_argument(
        "--master-port", type=int, metavar="PORT", help="MindSpore's scheduler port (scheduler.port)"
    )


def adhoc_flags(args: argparse.Namespace) -> AdhocFlags:
    return AdhocFlags(
        hosts=args.hosts,
        hostfile=args.hostfile,
        nproc_per_node=args.nproc_per_node,
        device_target=args.device_target,
        python=args.python,
        env=tuple(args.env),
        master_port=args.master_port,
    )
