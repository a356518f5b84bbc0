"""``env.leftover``, ``env.nccl_disable``, ``env.timeouts`` and ``env.rank_table``: what the
environment the ranks inherit could break."""

from __future__ import annotations

import os

from .params import Params
from .rank_table import rank_table_result
from .results import NA, OK, WARN, result

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
    out.append(rank_table_result(p))
    return out


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
