"""``gpu.visible`` / ``npu.visible``: the devices a *_VISIBLE_DEVICES variable gives the ranks exist
on this node and are enough for its ranks."""

from __future__ import annotations

from .params import Params
from .results import FAIL, OK, result
from .smi import num


def visible_entries(p: Params, var: str) -> tuple:
    """(raw value or None, list of entries) of a *_VISIBLE_DEVICES variable the ranks will see."""
    raw = p.env_value(var)
    if raw is None:
        return None, []
    return raw, [e.strip() for e in raw.split(",") if e.strip()]


def visible_result(name: str, var: str, raw: str | None, entries: list, known: list, p: Params) -> tuple:
    """A result for CUDA_VISIBLE_DEVICES/ASCEND_RT_VISIBLE_DEVICES, and the device ids the ranks use."""
    count = len(known)
    want = p.devices
    if raw is None:
        use = list(range(want if want is not None else count))
        return result(name, OK, "%s not set: all %d visible" % (var, count)), use
    use = []
    bad = []
    for e in entries:
        idx = num(e) if e.lstrip("-").isdigit() else None
        by_uuid = [i for i, k in enumerate(known) if e.startswith("GPU-") and k.startswith(e)]
        if idx is not None and 0 <= idx < count:
            use.append(idx)
        elif len(by_uuid) == 1:  # a GPU UUID, or a unique prefix of one, as CUDA accepts
            use.append(by_uuid[0])
        elif e.startswith("MIG-"):  # a MIG instance: on one of the GPUs, which one nvidia-smi -L tells
            use.append(-1)
        else:
            bad.append(e)
    where = "%s=%s" % (var, raw)
    if bad:
        return (
            result(
                name,
                FAIL,
                where,
                "give %s only ids of this node's %d devices (0..%d)" % (var, count, max(count - 1, 0)),
                "no such device: %s" % ", ".join(bad),
            ),
            use,
        )
    if want is not None and len(use) < want:
        return (
            result(
                name,
                FAIL,
                where,
                "make %s list %d devices, or set devices: %d for this node" % (var, want, len(use)),
                "%d visible, %d ranks on this node" % (len(use), want),
            ),
            use,
        )
    return result(name, OK, where), use
