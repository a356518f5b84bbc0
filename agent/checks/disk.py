"""``disk.workdir`` and ``disk.checkpoint_dir``: free space against ``disk_min_gib``."""

from __future__ import annotations

import os

from .params import Params
from .results import FAIL, GIB, OK, human_size, result


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


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
        value = "%s free" % human_size(free)
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
