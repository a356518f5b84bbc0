"""State the script changes in training that ``keep`` does not hold: found, so a relaunch that
could not restore it refuses instead of computing something else.

Two probes, each cheap and run a few times per launch:

- :class:`Unkept`: every live ``Parameter`` and NumPy generator outside ``keep`` is digested at
  two step boundaries; one that changed between them (EMA weights, a loss scaler's counter, a
  gradient-accumulation buffer, a ``default_rng`` the loop draws from) is training state that a
  relaunch would reset.
- :func:`pipeline_draws`: NumPy's and Python's global random state around a data pipeline's
  first batch, while the training thread draws nothing: a change is the pipeline drawing from
  them in its own threads, which no resume can replay.
"""

from __future__ import annotations

import gc
import hashlib
import random
import weakref
from typing import Any, Callable

import numpy as np

_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)
_MAX_BYTES = 64 << 20  # parameters digested per probe: the unkept ones are small (EMA of a toy is not)


def _parameter_class() -> type | None:
    try:
        from mindspore import Parameter

        return Parameter
    except Exception:  # noqa: BLE001 - no MindSpore: only generators are probed
        return None


def _owner_name(obj: Any) -> str:
    """A name a user recognises: the attribute (or variable) that holds ``obj``."""
    for ref in gc.get_referrers(obj):
        if isinstance(ref, dict):
            for key, value in ref.items():
                if value is obj and isinstance(key, str) and not key.startswith("__"):
                    return key
    return type(obj).__name__


class Unkept:
    """Digests of the state outside ``keep`` (``kept``: ids of what is kept), taken twice."""

    def __init__(self, kept: set[int]) -> None:
        self.kept = kept
        self._first: dict[int, str] | None = None
        self._objects: dict[int, Any] = {}

    def _scan(self) -> dict[int, str]:
        param_cls = _parameter_class()
        global_rs = getattr(np.random, "mtrand", None)
        global_rs = getattr(global_rs, "_rand", None)
        out: dict[int, str] = {}
        budget = _MAX_BYTES
        for obj in gc.get_objects():
            if type(obj) in _PROXIES or id(obj) in self.kept:
                continue
            try:
                if param_cls is not None and isinstance(obj, param_cls):
                    nbytes = int(obj.nbytes) if hasattr(obj, "nbytes") else 0
                    if nbytes > budget:
                        continue
                    budget -= nbytes
                    digest = hashlib.sha256(np.ascontiguousarray(obj.asnumpy()).tobytes()).hexdigest()
                elif isinstance(obj, np.random.Generator):
                    digest = hashlib.sha256(repr(obj.bit_generator.state).encode()).hexdigest()
                elif isinstance(obj, np.random.RandomState) and obj is not global_rs:
                    digest = hashlib.sha256(repr(obj.get_state(legacy=False)).encode()).hexdigest()
                else:
                    continue
            except Exception:  # noqa: BLE001 - an object that cannot be read now is not state we know
                continue
            out[id(obj)] = digest
            self._objects[id(obj)] = obj
        return out

    AT = (1, 3)  # the steps of a launch between which it looks for changes

    def stepped(self, local: int, note: Callable[[str], None]) -> bool:
        """After this launch's step ``local``: digests at the first probe step, each change since
        noted at the second; True once done (the caller drops the probe)."""
        if local == self.AT[0]:
            self.first()
        elif local >= self.AT[1]:
            for reason in self.changed():
                note(reason)
            return True
        return False

    def first(self) -> None:
        self._first = self._scan()

    def changed(self) -> list[str]:
        """What changed since :meth:`first`, each as a one-line reason with its fix."""
        if self._first is None:
            return []
        now = self._scan()
        reasons = []
        for key, digest in now.items():
            if key in self._first and self._first[key] != digest:
                obj = self._objects[key]
                if hasattr(obj, "bit_generator") or isinstance(obj, np.random.RandomState):
                    what = f"the NumPy generator {_owner_name(obj)!r}"
                else:
                    what = f"the Parameter {getattr(obj, 'name', '?')!r}"
                reasons.append(
                    f"{what} changes in training but is not in keep: add it (or its owner) to keep"
                )
        self._first, self._objects = None, {}
        return reasons


def global_random_digest() -> str:
    """A digest of NumPy's and Python's global random state."""
    _, keys, pos, _, _ = np.random.get_state()
    h = hashlib.sha256(np.ascontiguousarray(keys).tobytes())
    h.update(str(pos).encode())
    h.update(repr(random.getstate()).encode())
    return h.hexdigest()


PIPELINE_DRAWS = (
    "the data pipeline draws from NumPy's or Python's global random state in its own threads, which "
    "no resume can replay: draw per sample from np.random.default_rng(seed + index)"
)


SET_DATA = (
    "the script replaces the Parameter {name!r} with set_data once training has begun, which the graphs "
    "that ran (PyNative) do not see: the uninterrupted run goes on with the old value, a relaunch would "
    "start from the new one; write it in place with ops.assign(param, value)"
)
_watched: list[tuple[Callable[[], set[int]], Callable[[str], None]]] = []


def watch_set_data(kept: Callable[[], set[int]], note: Callable[[str], None]) -> None:
    """Note (``note``) a ``set_data`` on a kept parameter after the stage's first step, in
    PyNative: measured, an optimizer keeps the learning rate it first ran with through it."""
    try:
        from mindspore.common.parameter import Parameter
    except Exception:  # noqa: BLE001 - no MindSpore: nothing to watch
        return
    _watched.append((kept, note))
    if getattr(Parameter.set_data, "_mscon_watched", False):
        return
    original = Parameter.set_data

    def set_data(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        if _watched and _pynative():
            for ids, say in _watched:
                if id(self) in ids():
                    say(SET_DATA.format(name=getattr(self, "name", "?")))
        return original(self, data, *args, **kwargs)

    set_data._mscon_watched = True  # type: ignore[attr-defined]
    Parameter.set_data = set_data  # type: ignore[method-assign]


def _pynative() -> bool:
    try:
        import mindspore as ms

        return ms.get_context("mode") == ms.PYNATIVE_MODE
    except Exception:  # noqa: BLE001
        return False


DROPOUT = (
    "{names} on CPU draws masks that two uninterrupted runs with the same seed do not repeat "
    '(measured on MindSpore 2.10, also with deterministic="ON"): a resume goes on training from the '
    "snapshot, but not bit for bit as the uninterrupted run would (mscon check --resume says where)"
)


def unrepeatable_cells(keep: Any) -> str | None:
    """A warning naming the kept Cells in training whose CPU kernels are not deterministic
    (``nn.Dropout``), or None: said, not refused, as no run of them repeats itself."""
    try:
        import mindspore as ms
        from mindspore import nn

        if ms.get_context("device_target") != "CPU":
            return None
    except Exception:  # noqa: BLE001 - no MindSpore: no cells
        return None
    objects = list(keep.values()) if isinstance(keep, dict) else keep
    objects = objects if isinstance(objects, (tuple, list)) else (objects,)
    names: list[str] = []
    for obj in objects:
        if not isinstance(obj, nn.Cell):
            continue
        for name, cell in obj.cells_and_names():
            if isinstance(cell, nn.Dropout) and cell.training and name not in names:
                names.append(name or type(cell).__name__)
    if not names:
        return None
    shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return DROPOUT.format(names=f"nn.Dropout {shown}")
