"""No import cycle among the project's modules, function-level and ``TYPE_CHECKING`` imports included.

The source tree is read with ``ast`` (nothing is imported): every ``import`` and ``from ... import``
anywhere in a module counts, relative ones resolved. Modules are named by their path in the
repository (``console.cli.main``); the installed names (``mscon.console.cli.main``), the agent's
relative imports and the trainer's ``trainer.x`` / ``mscon_resume.x`` all map onto those names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("console", "agent", "trainer", "mscon_resume")
INSTALLED_PREFIX = "mscon."  # console/ installs as mscon.console, agent/ as mscon.agent, ...

Graph = dict[str, set[str]]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


def canonical(name: str) -> str:
    """``mscon.console.x`` -> ``console.x``; names outside the project are returned unchanged."""
    if name.startswith(INSTALLED_PREFIX) and name[len(INSTALLED_PREFIX) :].split(".")[0] in ROOTS:
        return name[len(INSTALLED_PREFIX) :]
    return name


def package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports(module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Every project module the file imports anywhere in it (``from pkg import sub``: ``pkg.sub``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (canonical(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(module, path).split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = canonical(node.module or "")
            for alias in node.names:
                yield f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source


def import_graph() -> Graph:
    modules = project_modules()
    return {
        name: {target for target in imports(name, path, modules) if target in modules and target != name}
        for name, path in modules.items()
    }


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(component: list[str], graph: Graph) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"{{{', '.join(component)}}}: " + "; ".join(edges)


def test_the_project_has_no_import_cycle() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph) for c in found)


def test_the_graph_sees_every_kind_of_import() -> None:
    """The walk resolves installed names, relative imports, function-level imports and the trainer's."""
    graph = import_graph()
    assert "agent.protocol" in graph["console.engine.session"]  # from mscon.agent.protocol import ...
    assert "agent.layout" in graph["agent.procs"]  # from . import layout
    assert "agent.protocol" in graph["agent.detached.run"]  # from ..protocol / from .. import protocol
    assert "trainer.config" in graph["trainer.train"]  # from trainer.config import ...
    assert "trainer.models" in graph["trainer.train"]  # inside a function (load_source)
    assert "mscon_resume.core" in graph["mscon_resume"]  # the package's own __init__


def test_a_cycle_is_found_and_named() -> None:
    graph: Graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert describe(["a", "b", "c"], graph) == "{a, b, c}: a -> b; b -> c; c -> a"
