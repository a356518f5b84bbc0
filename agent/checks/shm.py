"""``shm``: size and free space of ``shm_path`` (default /dev/shm) against ``shm_min_gib``."""

from __future__ import annotations

import math
import os

from .params import Params
from .results import FAIL, GIB, MIB, OK, human_size, result

DOCKER_SHM_DEFAULT = 64 * MIB


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
    value = "%s free of %s" % (human_size(free), human_size(total))
    need = p.shm_min_gib * GIB
    if free >= need:
        return [result("shm", OK, value, detail="%s; at least %g GiB wanted" % (path, p.shm_min_gib))]
    want = max(1, math.ceil((total - free) / GIB + p.shm_min_gib))
    detail = "%s has %s free, below shm_min_gib %g" % (path, human_size(free), p.shm_min_gib)
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
