"""What mscon takes from Textual beyond its public API is all in console/views/tui/textual_compat.py; these
tests fail, naming the attribute and the installed Textual version, when an upgrade breaks it."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from conftest import REPO
from mscon.console.views import tui
from mscon.console.views.tui import textual_compat
from packaging.requirements import Requirement

# Attributes Textual's metaclasses, __init_subclass__ and abc put on every subclass: not ours.
_GENERATED = {
    "_abc_impl",
    "_computes",
    "_css_type_name",
    "_css_type_names",
    "_decorated_handlers",
    "_inherit_bindings",
    "_inherit_component_classes",
    "_inherit_css",
    "_merged_bindings",
    "_reactives",
}


def test_the_private_textual_attributes_mscon_uses_are_there() -> None:
    problems = textual_compat.problems()
    assert not problems, "\n".join(problems)


def test_the_installed_textual_is_in_the_pinned_range() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (pin,) = [Requirement(d) for d in deps if Requirement(d).name == "textual"]
    assert pin.specifier, "pyproject.toml: pin textual to the range the tests ran with"
    assert pin.specifier.contains(textual_compat.TEXTUAL_VERSION), (
        f"textual {textual_compat.TEXTUAL_VERSION} is outside the range pyproject.toml pins ({pin.specifier})"
    )


@pytest.mark.skipif(sys.platform == "win32", reason="the non-blocking driver is the Linux driver's")
def test_only_the_adapter_reaches_into_textual() -> None:
    """No other module reads a private attribute of a Textual object (``x._name`` on anything but
    ``self``/``cls``), and no mscon subclass of a Textual class defines a private name its Textual
    bases already use: that would silently replace Textual's own (as ``App._flush`` once did)."""
    found: list[str] = []
    for info in pkgutil.walk_packages(tui.__path__, tui.__name__ + "."):
        module = importlib.import_module(info.name)
        if module is textual_compat:
            continue
        path = Path(inspect.getfile(module))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.name}:{node.lineno}: .{node.attr} (move it to textual_compat.py)")
        for name, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__ or cls.__name__ != name:
                continue  # not defined here, or an alias of a class seen under its own name
            bases = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] == "textual"]
            if not bases:
                continue
            theirs = frozenset().union(*(_private_names(b, stored_only=False) for b in bases))
            for clash in sorted((_private_names(cls, stored_only=True) & theirs) - _GENERATED):
                found.append(
                    f"{path.name}: {name}.{clash} is also a private name of its Textual bases "
                    f"(textual {textual_compat.TEXTUAL_VERSION}); rename ours"
                )
    assert not found, "\n".join(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache  # Textual's base classes are shared by most of ours, and big to parse
def _private_names(cls: type, stored_only: bool) -> frozenset[str]:
    """The private names a class defines (methods, class attributes, ``self._x = ...``), or with
    ``stored_only`` False also those it merely reads."""
    names = {n for n in vars(cls) if _private(n)}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return frozenset(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if _private(node.attr) and (not stored_only or isinstance(node.ctx, ast.Store)):
                names.add(node.attr)
    return frozenset(names)
