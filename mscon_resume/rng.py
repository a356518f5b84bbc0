"""The random state a continued run needs to compute what the uninterrupted run would have:
Python's ``random``, NumPy's global generator and MindSpore's default generator."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

PREFIX = "__rng_"  # snapshot arrays of this prefix are random state, not parameters
_NUMPY = PREFIX + "numpy__"
_MINDSPORE = PREFIX + "mindspore__"


def capture() -> tuple[dict, dict[str, np.ndarray]]:
    """(JSON-able part, arrays) of the current random state."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    meta: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, int(pos), int(has_gauss), float(cached)],
    }
    arrays = {_NUMPY: np.array(keys, copy=True)}
    try:
        import mindspore as ms

        arrays[_MINDSPORE] = np.array(ms.get_rng_state().asnumpy(), copy=True)
    except Exception:  # noqa: BLE001 - a MindSpore without a default generator: nothing to keep
        pass
    return meta, arrays


def restore(meta: dict, arrays: dict[str, np.ndarray]) -> None:
    saved = meta.get("rng") or {}
    if "python" in saved:
        version, internal, gauss = saved["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in saved and _NUMPY in arrays:
        kind, pos, has_gauss, cached = saved["numpy"]
        np.random.set_state((kind, arrays[_NUMPY], pos, has_gauss, cached))
    if _MINDSPORE in arrays:
        import mindspore as ms

        ms.set_rng_state(ms.Tensor(arrays[_MINDSPORE]))


def parameters_only(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in arrays.items() if not k.startswith(PREFIX)}
