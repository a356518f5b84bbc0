"""Preflight checks run on a node: what breaks a distributed MindSpore run, found before it breaks it.

``run_node_checks(names, params)`` runs the named checks and returns one or more results per check,
each ``{"name", "status", "value", "remedy", "detail"}`` with status ``ok``, ``warn``, ``fail`` or
``n/a``. It never raises: a missing tool is ``n/a`` where the device target does not need it and a
``fail`` with a remedy where it does; every subprocess has a time limit (its whole process group
is killed when it runs over); a check that crashes is reported as a ``warn`` naming the error.

Stdlib only (psutil optional), Python 3.8+: this runs with whatever Python the node has.

Checks (``NODE_CHECKS``, in display order), the module answering each, and the results they report:

- ``python`` (python_env.py): ``python`` -- the node's Python for the ranks (``params["python"]``)
  runs; its version in ``value``.
- ``mindspore`` (python_env.py): ``mindspore`` -- MindSpore imports in that Python, with the ranks'
  environment (``params["env"]`` over the node's, so its ``PYTHONPATH`` counts); the bare version
  in ``value`` (e.g. ``2.10.0``) for the console to compare across nodes.
- ``devices`` (registry.py picks by target): GPU (gpu.py): ``gpu.count``, ``gpu.visible``,
  ``gpu.driver``, ``gpu.busy``, ``gpu.ecc``, ``gpu.xid`` (``nvidia-smi``, the kernel log); Ascend
  (npu.py): ``npu.count``, ``npu.visible``, ``npu.driver``, ``npu.health``, ``npu.busy``
  (``npu-smi info``), ``npu.link``, ``npu.net`` (``hccn_tool``, where present); CPU: ``devices``
  (n/a). The tools' output formats are parsed in smi.py, the *_VISIBLE_DEVICES rule in visible.py.
- ``shm`` (shm.py): ``shm`` -- size and free space of ``shm_path`` (default /dev/shm) vs
  ``shm_min_gib``.
- ``limits`` (limits.py): ``limits.memlock``, ``limits.nofile``.
- ``disk`` (disk.py): ``disk.workdir``, ``disk.checkpoint_dir`` -- free space vs ``disk_min_gib``.
- ``port`` (ports.py): ``port`` -- the scheduler port can be bound on the first node (n/a elsewhere).
- ``ifname`` (ifname.py): ``ifname.NCCL_SOCKET_IFNAME`` / ``ifname.HCCL_SOCKET_IFNAME`` /
  ``ifname.GLOO_SOCKET_IFNAME`` for each one set, else ``ifname`` (n/a).
- ``env`` (env.py, rank_table.py): ``env.leftover``, ``env.nccl_disable``, ``env.timeouts``,
  ``env.rank_table``.
- ``clock`` (clock.py): ``clock`` -- this node's ``time.time_ns()`` (when the request arrived) in
  ``value``; the offset from ``params["console_time_ns"]`` in ``detail``.

Shared by them: results.py (the result record, wording helpers), params.py (the request's
parameters), tools.py (finding and running the node's tools). mesh.py is the preflight's TCP mesh
test (a listener and a prober, driven by the console's MeshListen/MeshProbe messages).

This module loads none of the checks until the first request: an agent that only runs ranks, or
only serves the mesh test, never does.
"""

from __future__ import annotations

import time
from typing import Sequence

NODE_CHECKS = ("python", "mindspore", "devices", "shm", "limits", "disk", "port", "ifname", "env", "clock")
# Cheap enough (well under a second together) to run before every `mscon run`: no device tool,
# no MindSpore import. "python" starts the node's Python once (tens of milliseconds), unless the ranks
# run the agent's own interpreter.
QUICK_CHECKS = ("python", "shm", "limits", "disk", "port", "ifname", "env", "clock")


def run_node_checks(names: Sequence[str], params: dict | None = None) -> list:
    """Run the named checks on this node; never raises. Each result:
    {"name": str, "status": "ok"|"warn"|"fail"|"n/a", "value": str, "remedy": str, "detail": str}"""
    received_ns = time.time_ns()
    from .registry import run_checks  # the check modules load on the first request only

    return run_checks(names, params, received_ns)
