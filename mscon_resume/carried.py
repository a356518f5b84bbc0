"""Values the script's own loops carry from step to step: kept with each snapshot and put back
where the resumed epoch begins, or, where a snapshot cannot hold one, said (refused on relaunch).

A counter (``steps_done += 1``), a running loss (``total += loss``), the best accuracy so far
(``if acc > best: best = acc``), a list of losses (``losses.append(...)``): plain values in the
script's frames that no ``keep`` holds, so a relaunch that restores only the kept objects would
run on with them reset. The loops around the ``batches``/``epochs`` call are read from the
script's source (:func:`carried_names`): a name is carried when a loop's body reads it before it
writes it, or updates it in place (``+=``, ``append``, ``d[k] = ...``). Their values are read
from the frames at each snapshot and written back, in the same frames, at the start of the
resumed epoch's batches: after the epoch's start code ran again (``total = 0``), as the
uninterrupted run had them at the snapshot's step.

Attributes the loops change on an object that ``keep`` does not hold (``self.step += 1``) are
state too, which only the object's owner can keep: those are said, and a relaunch refuses.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import os
import sys
import sysconfig
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Any, Callable

import numpy as np

from .state import PIECE_PREFIX, Unkeepable, _decode, _encode

_HERE = os.path.dirname(os.path.abspath(__file__))
_PREFIX = f"{PIECE_PREFIX}carried_"  # snapshot arrays of carried values (not parameters)
_MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "add", "pop", "remove", "clear"})
_CONTAINERS = (list, dict)  # a value changed in place: restored in place, so every holder sees it
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)

UNKEEPABLE = (
    "the loop at {where} carries {name!r} from step to step, {what} that a snapshot cannot hold: keep "
    "it in an object passed to keep, or hold plain values (numbers, strings, lists, dicts, arrays, tensors)"
)
ATTRIBUTE = (
    "the loop at {where} changes {name!r} on an object that keep does not hold: add {owner!r} to keep "
    "(its numbers, arrays and tensors are kept)"
)
CELL_ATTRIBUTE = (
    "the loop at {where} changes {name!r}, a plain attribute of a Cell, which keep holds only the "
    "parameters of: make it a Parameter (updated with ops.assign), or keep it in another object"
)


@dataclass(frozen=True)
class Carried:
    """What one loop nest of the script carries (from its source)."""

    rebound: tuple[tuple[str, int], ...]  # (name, line): read before written, or ``+=``
    mutated: tuple[tuple[str, int], ...]  # (name, line): changed in place (``append``, ``[k] =``)
    attributes: tuple[tuple[str, str, int], ...]  # (owner, attribute, line): ``owner.attr += ...``


_NONE = Carried((), (), ())


class _Order(ast.NodeVisitor):
    """Each name's occurrences in the order Python evaluates them (a value before its target),
    without entering nested scopes."""

    def __init__(self) -> None:
        self.first: dict[str, ast.expr_context] = {}
        self.stored: dict[str, int] = {}
        self.augmented: dict[str, int] = {}
        self.mutated: dict[str, int] = {}
        self.attributes: dict[tuple[str, str], int] = {}

    def visit_Name(self, node: ast.Name) -> None:
        self.first.setdefault(node.id, type(node.ctx)())
        if isinstance(node.ctx, ast.Store):
            self.stored.setdefault(node.id, node.lineno)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        read = {_attribute(n) for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
        for target in node.targets:
            self._target(target, read)
            self.visit(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self._target(node.target, set())
        self.visit(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.augmented.setdefault(node.target.id, node.lineno)
            self.first.setdefault(node.target.id, ast.Load())
            self.stored.setdefault(node.target.id, node.lineno)
        else:
            read = {_attribute(node.target)} if isinstance(node.target, ast.Attribute) else set()
            self._target(node.target, read)
            self.visit(node.target)

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For  # noqa: N815 - ast's visitor naming

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _MUTATORS and isinstance(func.value, ast.Name):
            self.mutated.setdefault(func.value.id, node.lineno)
        self.generic_visit(node)

    def _target(self, target: ast.expr, read: set[tuple[str, str] | None]) -> None:
        """``read``: the attributes the assigned value reads (``x.n = x.n + 1`` carries ``x.n``;
        ``args.lr = f(step)`` carries nothing)."""
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            self.mutated.setdefault(target.value.id, target.lineno)
        elif isinstance(target, ast.Attribute) and _attribute(target) in read:
            self.attributes.setdefault(_attribute(target), target.lineno)  # type: ignore[arg-type]
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, read)

    def _skip(self, node: ast.AST) -> None:
        return None

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _skip  # noqa: N815
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _skip  # noqa: N815 - own scope


def _attribute(node: ast.Attribute) -> tuple[str, str] | None:
    """``("owner", "attr")`` of ``owner.attr``, else None."""
    return (node.value.id, node.attr) if isinstance(node.value, ast.Name) else None


def _loop_carries(loop: ast.For | ast.AsyncFor | ast.While) -> Carried:
    order = _Order()
    for stmt in loop.body:
        order.visit(stmt)
    own = set()
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        own = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    rebound = {
        name: line
        for name, line in order.stored.items()
        if name not in own and (name in order.augmented or isinstance(order.first.get(name), ast.Load))
    }
    mutated = {n: line for n, line in order.mutated.items() if n not in order.stored and n not in own}
    attributes = tuple((o, a, line) for (o, a), line in order.attributes.items() if o not in order.stored)
    return Carried(tuple(rebound.items()), tuple(mutated.items()), attributes)


def _scope_of(tree: ast.Module, code_name: str, first_line: int) -> ast.AST | None:
    if code_name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code_name:
            lines = [node.lineno] + [d.lineno for d in node.decorator_list]
            if first_line in lines:
                return node
    return None


def _loops_around(scope: ast.AST, line: int) -> list[ast.AST]:
    """The loops of ``scope`` (not of scopes nested in it) whose lines hold ``line``."""
    found: list[ast.AST] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES):
                continue
            if isinstance(child, _LOOPS) and child.lineno <= line <= (child.end_lineno or child.lineno):
                found.append(child)
            walk(child)

    walk(scope)
    return found


_TREES: dict[str, ast.Module | None] = {}
_SITES: dict[tuple[str, str, int, int], Carried] = {}


def carried_names(filename: str, code_name: str, first_line: int, line: int) -> Carried:
    """What the loops around ``line`` of a frame (``code_name`` starting at ``first_line`` of
    ``filename``) carry from one iteration to the next."""
    key = (filename, code_name, first_line, line)
    if key in _SITES:
        return _SITES[key]
    if filename not in _TREES:
        try:
            with open(filename, encoding="utf-8") as f:
                _TREES[filename] = ast.parse(f.read(), filename)
        except (OSError, SyntaxError, ValueError):
            _TREES[filename] = None  # no source (a notebook cell, a zip): nothing to read
    tree = _TREES[filename]
    scope = _scope_of(tree, code_name, first_line) if tree is not None else None
    if scope is None:
        _SITES[key] = _NONE
        return _NONE
    rebound: dict[str, int] = {}
    mutated: dict[str, int] = {}
    attributes: dict[tuple[str, str], int] = {}
    for loop in _loops_around(scope, line):
        c = _loop_carries(loop)  # type: ignore[arg-type]
        for name, at in c.rebound:
            rebound.setdefault(name, at)
        for name, at in c.mutated:
            mutated.setdefault(name, at)
        for owner, attr, at in c.attributes:
            attributes.setdefault((owner, attr), at)
    mutated = {n: at for n, at in mutated.items() if n not in rebound}
    found = Carried(
        tuple(rebound.items()), tuple(mutated.items()), tuple((o, a, at) for (o, a), at in attributes.items())
    )
    _SITES[key] = found
    return found


# ------------------------------------------------------------------ the script's frames


_INSTALLED = tuple(
    {sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


@functools.cache
def _library_or_installed(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_HERE + os.sep) or path.startswith(_INSTALLED)


def script_frames() -> list[FrameType]:
    """The script's frames on the stack, innermost first (the library's and installed
    packages' own left out)."""
    frames: list[FrameType] = []
    frame = sys._getframe(1)
    while frame is not None:
        if not _library_or_installed(frame.f_code.co_filename):
            frames.append(frame)
        frame = frame.f_back  # type: ignore[assignment]
    return frames


def _site(frame: FrameType) -> Carried:
    code = frame.f_code
    return carried_names(code.co_filename, code.co_name, code.co_firstlineno, frame.f_lineno)


def _where(frame: FrameType, line: int) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{line}"


def _names(frame: FrameType) -> dict[str, Any]:
    """A frame's variables as the script sees them (a function's locals, else the module's)."""
    return frame.f_locals if frame.f_code.co_name != "<module>" else frame.f_globals


class Carrier:
    """The carried values of the script's frames around one stage's loop: captured with each
    snapshot, restored at the resumed epoch's start. ``kept``: ids of what ``keep`` holds."""

    def __init__(self, keep: Any, kept: Callable[[], set[int]], note: Callable[[str], None]) -> None:
        self._kept = kept
        self._note = note
        objects = list(keep.values()) if isinstance(keep, dict) else keep
        objects = objects if isinstance(objects, (tuple, list)) else (objects,)
        self._cells = {id(o) for o in objects if hasattr(o, "construct") and hasattr(o, "get_parameters")}
        self._told: set[str] = set()

    def _each(self) -> list[tuple[int, FrameType, Carried]]:
        return [(depth, f, _site(f)) for depth, f in enumerate(script_frames())]

    def capture(self) -> tuple[dict, dict[str, np.ndarray]]:
        """``({"frame depth:name": encoded value}, arrays)`` of every carried value now."""
        meta: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {}
        kept = self._kept()
        for depth, frame, site in self._each():
            names = _names(frame)
            mutated = {name for name, _ in site.mutated}
            for name, line in site.rebound + site.mutated:
                if name not in names:
                    continue  # not bound yet (a name first set later in the loop)
                value = names[name]
                if isinstance(value, ModuleType) or callable(value) or id(value) in kept:
                    continue  # structure, or state keep already holds
                if name in mutated and not isinstance(value, _CONTAINERS):
                    continue  # a method of another object (a progress bar's update): not known state
                try:
                    meta[f"{depth}:{name}"] = _encode(value, arrays, _PREFIX, name)
                except Unkeepable:
                    what = f"a {type(value).__name__}"
                    self._say(UNKEEPABLE.format(where=_where(frame, line), name=name, what=what))
            for owner, attr, line in site.attributes:
                obj = names.get(owner)
                if obj is None or isinstance(obj, (ModuleType, type)) or id(obj) in kept:
                    continue
                said = CELL_ATTRIBUTE if id(obj) in self._cells else ATTRIBUTE
                self._say(said.format(where=_where(frame, line), name=f"{owner}.{attr}", owner=owner))
        return meta, arrays

    def restore(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        """Each captured value back into the frame and name it was read from."""
        frames = script_frames()
        by_frame: dict[int, dict[str, Any]] = {}
        for key, encoded in meta.items():
            depth, _, name = key.partition(":")
            if not depth.isdigit() or int(depth) >= len(frames):
                continue
            by_frame.setdefault(int(depth), {})[name] = _decode(encoded, arrays)
        for depth, values in by_frame.items():
            _write(frames[depth], values)

    def _say(self, reason: str) -> None:
        if reason not in self._told:
            self._told.add(reason)
            self._note(reason)


def _write(frame: FrameType, values: dict[str, Any]) -> None:
    names = _names(frame)
    for name, value in values.items():
        held = names.get(name)
        if isinstance(held, list) and isinstance(value, list):
            held[:] = value  # in place: another holder of the list sees it too
            continue
        if isinstance(held, dict) and isinstance(value, dict):
            held.clear()
            held.update(value)
            continue
        names[name] = value
    if frame.f_code.co_name != "<module>" and sys.version_info < (3, 13):
        # Before PEP 667 a function's f_locals is a copy: written back to the frame's own slots.
        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
