"""The random state a continued run needs to compute what the uninterrupted run would have:
Python's ``random``, NumPy's global generator, MindSpore's default generator and its op seeds
(the Python-side counters from which ``ops.standard_normal`` and friends draw a new seed at each
call). Generators the script makes itself are kept through ``keep`` (:mod:`state`)."""

from __future__ import annotations

import importlib
import random
import sys
from typing import Any

import numpy as np

PREFIX = "__rng_"  # snapshot arrays of this prefix are random state, not parameters
EPOCH = PREFIX + "epoch_"  # the random state as an epoch began (``epochs``): its arrays' prefix


def capture(prefix: str = PREFIX) -> tuple[dict, dict[str, np.ndarray]]:
    """(JSON-able part, arrays named ``prefix``...) of the current random state."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    meta: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, int(pos), int(has_gauss), float(cached)],
    }
    arrays = {prefix + "numpy__": np.array(keys, copy=True)}
    try:
        import mindspore as ms

        arrays[prefix + "mindspore__"] = np.array(ms.get_rng_state().asnumpy(), copy=True)
    except Exception:  # noqa: BLE001 - a MindSpore without a default generator: nothing to keep
        pass
    seeds = _kernel_seeds()
    if seeds is not None:
        meta["ms_op_seeds"] = [
            [kernel, op_seed, int(value)] for (kernel, op_seed), value in sorted(seeds.items())
        ]
    return meta, arrays


def _kernel_seeds() -> dict | None:
    """MindSpore's op-seed counters (``mindspore.common.seed._KERNEL_SEED``), or None."""
    if "mindspore" not in sys.modules:
        return None  # a script without MindSpore: nothing to keep, and no import to pay
    try:  # by its full name: ``mindspore.common.seed`` is also a function of that package
        seed = importlib.import_module("mindspore.common.seed")
    except Exception:  # noqa: BLE001 - no MindSpore: nothing to keep
        return None
    table = getattr(seed, "_KERNEL_SEED", None)
    return table if isinstance(table, dict) else None


def restore(meta: dict, arrays: dict[str, np.ndarray], prefix: str = PREFIX) -> None:
    """Put back the random state ``capture`` took (``meta["rng"]``: its JSON-able part)."""
    saved = meta.get("rng") or {}
    numpy_keys, mindspore_state = prefix + "numpy__", prefix + "mindspore__"
    if "python" in saved:
        version, internal, gauss = saved["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in saved and numpy_keys in arrays:
        kind, pos, has_gauss, cached = saved["numpy"]
        np.random.set_state((kind, arrays[numpy_keys], pos, has_gauss, cached))
    if mindspore_state in arrays:
        import mindspore as ms

        ms.set_rng_state(ms.Tensor(arrays[mindspore_state]))
    table = _kernel_seeds()
    if table is not None and "ms_op_seeds" in saved:
        table.clear()  # in place: MindSpore's functions read this very dict
        table.update({(kernel, op_seed): value for kernel, op_seed, value in saved["ms_op_seeds"]})


def parameters_only(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in arrays.items() if not k.startswith(PREFIX)}
