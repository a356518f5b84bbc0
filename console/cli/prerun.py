"""What ``mscon run`` refuses in an inventory before it connects anywhere: one function, so that
``mscon validate`` runs exactly these checks too (it accepted ``workdir: /`` that run refused)."""

from __future__ import annotations

from mscon.console.config.inventory import Inventory


def refused_before_connecting(inv: Inventory) -> str | None:
    """Why the inventory cannot run, in one line, found without connecting; None where it can.

    Today that is the workdir: ``/``, a home folder or one too large to copy to every node. Local
    nodes run in the workdir itself, so nothing is copied and nothing is refused for them."""
    from mscon.console.transport.workdir import WorkdirRefused, check_workdir

    if inv.slurm is None and all(n.transport == "local" for n in inv.nodes):
        return None
    try:
        check_workdir(inv.job.workdir, inv.job.exclude, inv.job.max_workdir_gib)
    except WorkdirRefused as exc:
        return str(exc)
    return None
