"""The import graph of ``core``: no module imports itself back through others, a few layers never
import the ones above them, and the library tier imports no HTTP module. Read from the source with ``ast`` (every ``import``, module-level and inside
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

#: the HTTP tier: the API and the entry points that start its server. Every other module of ``core`` is the
#: library tier (serving, engine, tasks, backends, bulk, cache, the in-process API ...), usable without HTTP
HTTP_TIER = ("core.api", "core.cli", "core.dev")
#: what the library tier never imports
HTTP_MODULES = ("fastapi", "starlette", "uvicorn", "mangum", "core.api")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


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


def all_imports_of(path: Path, modules: set[str] = frozenset(), root: Path = ROOT) -> set[str]:
    """Every module the file at ``path`` imports, of any package (``from pkg import sub`` counts as
    ``pkg.sub`` when ``sub`` is one of ``modules``, else as ``pkg``)."""
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
    return found - {name}


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The modules of ``modules`` the file at ``path`` imports."""
    return {m for m in all_imports_of(path, modules, root) if m in modules}


def http_imports(package: Path = CORE) -> list[str]:
    """``"importer imports imported"`` for each HTTP module a library-tier module of ``package`` imports."""
    root = package.parent
    files = {module_name(p, root): p for p in sorted(package.rglob("*.py"))}
    return [f"{name} imports {imported}" for name, path in files.items() if not _within(name, HTTP_TIER)
            for imported in sorted(all_imports_of(path, set(files), root)) if _within(imported, HTTP_MODULES)]


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


def test_the_library_tier_imports_no_http_module():
    graph = import_graph()
    # the serving layer is library tier, and what the in-process API and the batch jobs run on
    assert "core.serving.embeddings" in graph["core.inprocess"]
    assert not _within("core.serving", HTTP_TIER) and not _within("core.inprocess", HTTP_TIER)
    bad = http_imports()
    assert not bad, bad


def test_an_http_import_of_the_library_tier_is_found(tmp_path):
    core = tmp_path / "core"
    (core / "serving").mkdir(parents=True)
    (core / "api").mkdir()
    for folder in (core, core / "serving", core / "api"):
        (folder / "__init__.py").write_text("")
    (core / "serving" / "a.py").write_text("def f():\n    from starlette.requests import Request\n")
    (core / "serving" / "b.py").write_text("from ..api import routes\n")
    (core / "serving" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import fastapi\n")
    (core / "api" / "routes.py").write_text("import fastapi\nfrom core.serving import a\n")
    assert http_imports(core) == ["core.serving.a imports starlette.requests", "core.serving.b imports core.api.routes"]
