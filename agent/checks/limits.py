"""``limits.memlock`` and ``limits.nofile``: this node's resource limits, which the ranks inherit."""

from __future__ import annotations

import resource

from .params import Params
from .results import OK, WARN, human_size, result

NOFILE_MIN = 65536


def _limit_str(v: int) -> str:
    return "unlimited" if v == resource.RLIM_INFINITY else str(v)


def check_limits(p: Params) -> list:
    out = []
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    value = "%s (hard %s)" % (
        _limit_str(soft) if soft == resource.RLIM_INFINITY else human_size(soft),
        _limit_str(hard) if hard == resource.RLIM_INFINITY else human_size(hard),
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
