"""The import graph of ``core``: no module imports itself back through others, and a few layers never
import the ones above them. Read from the source with ``ast`` (every ``import``, module-level and inside
functions; imports under ``if TYPE_CHECKING:`` are left out, they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.server import ROOT

CORE = ROOT / "core"

#: (importer, imported): modules under the first never import modules under the second
FORBIDDEN = (
    ("core.backends", "core.convert"),  # serving code does not depend on the converters
    ("core.config", "core.backends"),
    ("core.hub", "core.backends"),
    ("core.loading", "core.backends"),
)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skipped.update(id(n) for n in ast.walk(stmt))
    return skipped


def _resolve(importer: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if not node.level:
        return node.module
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The modules of ``modules`` the file at ``path`` imports (``from pkg import sub`` counts as ``pkg.sub``
    when ``sub`` is a module, else as ``pkg``)."""
    name = module_name(path, root)
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node, path.name == "__init__.py")
            if target is None:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def import_graph(package: Path = CORE) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports."""
    root = package.parent
    files = {module_name(p, root): p for p in sorted(package.rglob("*.py"))}
    modules = set(files)
    return {name: imports_of(path, modules, root) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "core.engine" in graph and "core.convert.onnx_export" in graph
    assert "core.backends.registry" in graph["core.engine"]  # module level: from core.backends.registry import …
    assert "core.export_cache" in graph["core.backends.registry"]  # inside choose()
    assert "core.config" not in graph["core.hub"]  # only under TYPE_CHECKING


def test_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_local_imports_count(tmp_path):
    pkg = tmp_path / "core" / "pkg"
    pkg.mkdir(parents=True)
    (tmp_path / "core" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nimport core.pkg.a\n"
                              "if TYPE_CHECKING:\n    from core import c\n")
    (tmp_path / "core" / "c.py").write_text("from core.pkg import b\n")
    graph = import_graph(tmp_path / "core")
    assert graph == {"core": set(), "core.c": {"core.pkg.b"}, "core.pkg": {"core.pkg.a"},
                     "core.pkg.a": {"core.pkg.b"}, "core.pkg.b": {"core.pkg.a"}}
    assert cycles(graph) == [["core.pkg.a", "core.pkg.b"]]


def test_core_has_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in core: " + " | ".join(_describe(graph, c) for c in found)


def test_lower_layers_never_import_upper_ones():
    graph = import_graph()
    bad = [f"{importer} imports {imported}" for importer, targets in sorted(graph.items())
           for imported in sorted(targets)
           for low, high in FORBIDDEN
           if (importer == low or importer.startswith(low + ".")) and (imported == high or imported.startswith(high + "."))]
    assert not bad, bad
