"""The state contract: what ``keep`` holds, captured at a step boundary and put back on resume.

``keep`` is a tuple (or list) of objects, or a dict naming them (``{"g": opt_g, "d": opt_d}``):
names keep two objects' like-named state apart. Each object is one of

- a ``Parameter``, or a Cell (a network, an optimizer, a loss-scale cell): its parameters, and
  parameters it holds in plain lists (``mindspore.experimental.optim``'s learning rates);
- anything with ``state_dict()`` / ``load_state_dict()`` (schedulers, scalers, the script's own
  counters): its state dict, which may hold numbers, strings, lists, dicts, arrays and tensors;
- a random source: ``np.random.Generator``, ``np.random.RandomState``, ``random.Random``;
- any other object (``amp.DynamicLossScaler``, ``lr_scheduler.StepLR``, a ``class Warmup``): its
  attributes that are parameters, tensors, arrays or plain values (numbers, strings, and lists,
  tuples and dicts of them); attributes holding other objects are structure, not state.

A parameter is kept once however many objects hold it (a network's weights are also its
optimizer's). Two different parameters of the same name in an unnamed tuple cannot be told
apart on resume: that is a problem (:attr:`Kept.problems`) the relaunch refuses on.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

PIECE_PREFIX = "__kept_"  # snapshot arrays of this prefix belong to pieces, not parameters


class Kind(Enum):
    STATEFUL = "state_dict"
    NP_GENERATOR = "numpy Generator"
    NP_RANDOMSTATE = "numpy RandomState"
    PY_RANDOM = "random.Random"
    ATTRIBUTES = "attributes"


@dataclass(frozen=True)
class Piece:
    """One kept object that is not a parameter: how it is read and put back."""

    key: str  # its name in the snapshot: the dict's key, or keep[i]
    obj: Any
    kind: Kind


class Unkeepable(ValueError):
    """A value in a state dict that a snapshot cannot hold (its path and type)."""


def _is_parameter(obj: Any) -> bool:
    return type(obj).__name__ == "Parameter" and hasattr(obj, "set_data")


def _is_tensor(obj: Any) -> bool:
    return hasattr(obj, "asnumpy") and hasattr(obj, "dtype") and not _is_parameter(obj)


def _is_cell(obj: Any) -> bool:
    return hasattr(obj, "get_parameters") and hasattr(obj, "construct")


class Kept:
    """``keep`` resolved: the parameters (by snapshot name) and the other pieces."""

    def __init__(self, keep: Any) -> None:
        self.params: list[tuple[str, Any]] = []
        self.pieces: list[Piece] = []
        self.problems: list[str] = []
        self._by_key: dict[str, tuple[Any, str]] = {}
        self._seen: set[int] = set()
        if isinstance(keep, dict):
            items = [(str(k), v, True) for k, v in keep.items()]
        elif isinstance(keep, (tuple, list)):
            items = [(f"keep[{i}]", v, False) for i, v in enumerate(keep)]
        else:
            items = [("keep", keep, False)]
        for label, obj, named in items:
            self._add(label, obj, f"{label}/" if named else "", named)
        self.pieces = [piece for piece in self.pieces if self._storable(piece)]

    def _storable(self, piece: Piece) -> bool:
        """Whether a snapshot can hold the piece's state (else a problem: a state dict holding a
        function cannot be written, and training must not stop at its first snapshot)."""
        try:
            _encode(_read(piece), {}, "", piece.key)
        except Unkeepable as exc:
            self.problems.append(
                f"{exc}, which a snapshot cannot hold: keep numbers, strings, lists, dicts, arrays, tensors"
            )
            return False
        return True

    # ---------------------------------------------------------------- resolving

    def _add(self, label: str, obj: Any, prefix: str, named: bool) -> None:
        if _is_parameter(obj):
            self._param(prefix + obj.name, obj, label)
        elif _parameters_in(obj):  # a ParameterTuple, a list of parameters
            for p in _parameters_in(obj):
                self._param(prefix + p.name, p, label)
        elif _is_cell(obj):
            for p in obj.get_parameters():
                self._param(prefix + p.name, p, label)
            for _, value in sorted(vars(obj).items()):  # parameters a Cell holds in plain lists
                for p in _parameters_in(value):
                    self._param(prefix + p.name, p, label)
        elif callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
            self.pieces.append(Piece(label, obj, Kind.STATEFUL))
        elif isinstance(obj, np.random.Generator):
            self.pieces.append(Piece(label, obj, Kind.NP_GENERATOR))
        elif isinstance(obj, np.random.RandomState):
            self.pieces.append(Piece(label, obj, Kind.NP_RANDOMSTATE))
        elif isinstance(obj, random.Random):
            self.pieces.append(Piece(label, obj, Kind.PY_RANDOM))
        elif obj is None or isinstance(obj, (bool, int, float, str, bytes)) or _is_tensor(obj):
            what = type(obj).__name__
            self.problems.append(
                f"{label} is a {what}: a value cannot be put back in place; keep the object that holds it"
            )
        else:
            for name, value in sorted(vars(obj).items()) if hasattr(obj, "__dict__") else []:
                for p in _parameters_in(value):
                    self._param(prefix + p.name, p, f"{label}.{name}")
            self.pieces.append(Piece(label, obj, Kind.ATTRIBUTES))

    def _param(self, key: str, p: Any, owner: str) -> None:
        if id(p) in self._seen:
            return  # the same parameter through another object (an optimizer holds the weights)
        self._seen.add(id(p))
        if key in self._by_key:
            first = self._by_key[key][1]
            self.problems.append(
                f"keep holds two objects with the parameter {p.name} ({first} and {owner}): name them, "
                'as keep={"a": ..., "b": ...}'
            )
            return
        self._by_key[key] = (p, owner)
        self.params.append((key, p))

    @property
    def ids(self) -> set[int]:
        """Every kept parameter and random source (what the unkept-state probe passes over)."""
        return set(self._seen) | {id(piece.obj) for piece in self.pieces}

    # ---------------------------------------------------------------- capture and restore

    def capture(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(JSON-able part, arrays) of every piece; parameters are copied by the writer."""
        meta: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {}
        for i, piece in enumerate(self.pieces):
            meta[piece.key] = _encode(_read(piece), arrays, f"{PIECE_PREFIX}{i}_", piece.key)
        return meta, arrays

    def restore(self, meta: dict, arrays: dict[str, np.ndarray]) -> list[str]:
        """Put every piece back; returns what the snapshot lacked (named), for a refusal."""
        missing = []
        for piece in self.pieces:
            if piece.key not in meta:
                missing.append(piece.key)
                continue
            _write(piece, _decode(meta[piece.key], arrays))
        return missing

    def digests(self, param_arrays: dict[str, np.ndarray] | None = None) -> dict[str, str]:
        """A short digest per kept name: parameters from ``param_arrays`` (else read now), each
        piece from its state now. Two runs that agree on every digest hold the same state."""
        out: dict[str, str] = {}
        for key, p in self.params:
            a = param_arrays[key] if param_arrays is not None and key in param_arrays else p.asnumpy()
            out[key] = array_digest(np.asarray(a))
        meta, arrays = self.capture()
        for piece in self.pieces:
            h = hashlib.sha256(json.dumps(meta[piece.key], sort_keys=True).encode())
            for name in sorted(arrays):
                if name.startswith(f"{PIECE_PREFIX}{self.pieces.index(piece)}_"):
                    h.update(np.ascontiguousarray(arrays[name]).tobytes())
            out[piece.key] = h.hexdigest()[:16]
        return out


def optimizer_only_ids(objects: Any) -> set[int]:
    """The parameters an optimizer holds of its own (its learning rate, step count, moments), not
    the weights it updates: its compiled update reads them, and does not see a ``set_data`` made
    after it ran (``probe.watch_set_data``)."""
    found: set[int] = set()
    items = objects.values() if isinstance(objects, dict) else objects
    for obj in items if isinstance(items, (list, tuple)) or isinstance(objects, dict) else [items]:
        if not _is_cell(obj) or not hasattr(obj, "cells_and_names"):
            continue
        for _, cell in obj.cells_and_names():
            if any(k.__name__ == "Optimizer" for k in type(cell).__mro__):
                found.update(id(p) for p in cell.get_parameters(expand=False))
    return found


def put_back(p: Any, saved: np.ndarray) -> None:
    """A parameter's value, written into its own memory: a graph that has run holds that memory,
    and does not see a ``set_data`` made after it (measured: an optimizer in PyNative keeps its first
    learning rate through ``set_data``, not through ``ops.assign``)."""
    import mindspore as ms
    from mindspore import ops

    value = ms.Tensor(np.array(saved, order="C"))  # not ascontiguousarray: it makes a 0-d array 1-d
    try:
        ops.assign(p, value.astype(p.dtype))
    except (RuntimeError, TypeError, ValueError):  # not assignable in place (not yet initialised)
        p.set_data(value)


def array_digest(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(memoryview(a).cast("B"))
    return h.hexdigest()[:16]


def _parameters_in(value: Any) -> list[Any]:
    if _is_parameter(value):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(_is_parameter(v) for v in value):
        return list(value)
    return []


# ------------------------------------------------------------------ reading and writing a piece


def _read(piece: Piece) -> Any:
    obj = piece.obj
    if piece.kind is Kind.STATEFUL:
        return obj.state_dict()
    if piece.kind is Kind.NP_GENERATOR:
        return obj.bit_generator.state
    if piece.kind is Kind.NP_RANDOMSTATE:
        return obj.get_state(legacy=False)
    if piece.kind is Kind.PY_RANDOM:
        return obj.getstate()
    return {name: value for name, value in sorted(vars(obj).items()) if _storable(value)}


def _write(piece: Piece, state: Any) -> None:
    obj = piece.obj
    if piece.kind is Kind.STATEFUL:
        obj.load_state_dict(state)
    elif piece.kind is Kind.NP_GENERATOR:
        obj.bit_generator.state = state
    elif piece.kind is Kind.NP_RANDOMSTATE:
        obj.set_state(state)
    elif piece.kind is Kind.PY_RANDOM:
        obj.setstate(state)
    else:
        for name, value in state.items():
            old = getattr(obj, name, None)
            if isinstance(old, np.ndarray) and isinstance(value, np.ndarray) and old.shape == value.shape:
                old[...] = value  # in place: whoever shares the array sees the state too
            elif _is_parameter(old) or (isinstance(old, (list, tuple)) and _parameters_in(old)):
                continue  # parameters are restored with the others
            else:
                setattr(obj, name, value)


def _storable(value: Any, depth: int = 0) -> bool:
    """Whether an attribute is state a snapshot holds (else it is structure: left alone)."""
    if value is None or isinstance(value, (bool, int, float, str, np.ndarray, np.generic)):
        return True
    if _is_tensor(value):
        return True
    if depth < 4 and isinstance(value, (list, tuple)):
        return all(_storable(v, depth + 1) for v in value) and not _parameters_in(value)
    if depth < 4 and isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _storable(v, depth + 1) for k, v in value.items())
    return False


# ------------------------------------------------------------------ JSON with arrays beside it


def _encode(value: Any, arrays: dict[str, np.ndarray], prefix: str, path: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, (np.ndarray, np.generic)):
        name = f"{prefix}{len(arrays)}"
        arrays[name] = np.array(value, copy=True)
        return {"__array__": name, "scalar": isinstance(value, np.generic)}
    if _is_parameter(value) or _is_tensor(value):
        name = f"{prefix}{len(arrays)}"
        arrays[name] = np.array(value.asnumpy(), copy=True)
        return {"__tensor__": name}
    if isinstance(value, list):
        return [_encode(v, arrays, prefix, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, arrays, prefix, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        return {
            "__dict__": [
                [_encode(k, arrays, prefix, path), _encode(v, arrays, prefix, f"{path}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    raise Unkeepable(f"{path} holds a {type(value).__name__}")


def _decode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    if "__float__" in value:
        return float(value["__float__"])
    if "__array__" in value:
        a = arrays[value["__array__"]]
        return a[()] if value.get("scalar") else np.array(a, copy=True)
    if "__tensor__" in value:
        import mindspore as ms

        return ms.Tensor(np.array(arrays[value["__tensor__"]], copy=True))
    if "__tuple__" in value:
        return tuple(_decode(v, arrays) for v in value["__tuple__"])
    if "__dict__" in value:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in value["__dict__"]}
    return {k: _decode(v, arrays) for k, v in value.items()}
