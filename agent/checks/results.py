"""One check result and the wording helpers every check shares.

A result is ``{"name", "status", "value", "remedy", "detail"}``, plain JSON for the wire; status is
``ok``, ``warn``, ``fail`` or ``n/a``.
"""

from __future__ import annotations

OK, WARN, FAIL, NA = "ok", "warn", "fail", "n/a"

GIB = 1024**3
MIB = 1024**2


def result(name: str, status: str, value: str = "", remedy: str = "", detail: str = "") -> dict:
    return {"name": name, "status": status, "value": value, "remedy": remedy, "detail": detail}


def oneline(x: object, limit: int = 300) -> str:
    s = " ".join(str(x).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def human_size(n: float) -> str:
    if n >= GIB:
        return "%.1f GiB" % (n / GIB)
    if n >= MIB:
        return "%d MiB" % int(round(n / MIB))
    return "%d KiB" % int(round(n / 1024))
