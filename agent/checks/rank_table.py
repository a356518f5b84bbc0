"""``env.rank_table``: an Ascend rank table (RANK_TABLE_FILE) matches the job's ranks."""

from __future__ import annotations

import json

from .params import Params
from .results import FAIL, NA, OK, WARN, oneline, result

_RANK_TABLE_MAX = 16 * 1024 * 1024


def rank_table_result(p: Params) -> dict:
    """An Ascend rank table (RANK_TABLE_FILE, static networking) must list exactly the job's ranks:
    HCCL otherwise fails, or waits for ranks that never come, at the first collective."""
    path = p.env_value("RANK_TABLE_FILE")
    if not path:
        return result("env.rank_table", NA, "none", detail="RANK_TABLE_FILE is not set (dynamic networking)")
    fix = "regenerate the rank table for these nodes and devices, or unset RANK_TABLE_FILE (mscon needs none)"
    try:
        with open(path, "rb") as f:
            data = f.read(_RANK_TABLE_MAX + 1)
        if len(data) > _RANK_TABLE_MAX:
            raise ValueError("larger than 16 MiB")
        doc = json.loads(data)
        servers = doc["server_list"]
        ranks = [str(d.get("rank_id", "")).strip() for s in servers for d in s["device"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = (
            exc.strerror
            if isinstance(exc, OSError) and exc.strerror
            else "%s: %s" % (type(exc).__name__, exc)
        )
        return result("env.rank_table", FAIL, "unreadable: %s" % oneline(str(why), 160), fix, path)
    problems = []
    if p.world_size is not None and len(ranks) != p.world_size:
        problems.append("it lists %d devices, the inventory launches %d ranks" % (len(ranks), p.world_size))
    want = [str(i) for i in range(len(ranks))]
    if sorted(ranks, key=lambda r: (len(r), r)) != want:
        problems.append("its rank_id values are not 0..%d, each once" % (len(ranks) - 1))
    count = doc.get("server_count")
    if count is not None and str(count).strip() != str(len(servers)):
        problems.append("server_count %s but %d servers listed" % (count, len(servers)))
    if problems:
        return result("env.rank_table", FAIL, "; ".join(problems), fix, path)
    status = str(doc.get("status", "completed"))
    if status != "completed":
        return result(
            "env.rank_table",
            WARN,
            "status %r" % status,
            "HCCL reads only a rank table whose status is completed",
            path,
        )
    return result("env.rank_table", OK, "%d devices on %d servers" % (len(ranks), len(servers)), detail=path)
