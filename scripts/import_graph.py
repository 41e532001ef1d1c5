#!/usr/bin/env python3
"""The package-level import graph of ``core`` and ``adapters``, read from the source with ``ast``, as the
Mermaid block of docs/architecture.md.

Every import counts: module-level and inside functions, relative ones, and ``importlib.import_module``
calls, whose targets are strings (a module that calls ``import_module`` imports every known module its
string constants name, e.g. the backend registry's table). Imports under ``if TYPE_CHECKING:`` never run
and are left out. The nodes come from the tree: each sub-package of ``core`` (``core/api``,
``core/backends``, …) and each folder of ``adapters`` is one node; the modules directly under ``core`` are
grouped by what they do (``TOP_LEVEL``), and one that no group names is a node of its own.

    .venv/bin/python scripts/import_graph.py          # print the block
    .venv/bin/python scripts/import_graph.py --write  # write it between the markers of docs/architecture.md
    .venv/bin/python scripts/import_graph.py --check  # exit 1 when the page's block differs from the code,
                                                      # or on an import cycle

``--check`` also fails on a cycle, naming it: between modules (every import that runs, function-local ones
included), and between the nodes of the picture through what runs at import (module-level imports: a
function may reach a package above it on demand, never at import).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- import-graph:start -->", "<!-- import-graph:end -->"
#: the top-level folders the graph covers
TREES = ("core", "adapters")
#: modules directly under ``core``, grouped by what they do (a module no group names is a node of its own;
#: a name that no longer exists is skipped)
TOP_LEVEL = {
    "core: entry points": ("__main__", "cli", "cli_compat", "dev", "healthcheck"),
    "core: engine": ("engine", "batching", "preparing"),
    "core: model files": ("hub", "loading", "tokenization", "word_pieces"),
    "core: inputs and outputs": ("media", "quantize"),
    "core: process and devices": ("torch_thread", "devices", "cuda_driver", "snapshot", "frontends", "supervisor", "collector"),
    "core: foundation": ("errors", "capabilities", "logs", "metrics", "tracing", "request_context"),
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
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


def _calls_import_module(tree: ast.AST, skipped: set[int]) -> bool:
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__"):
            return True
    return False


def _known(name: str, modules: set[str]) -> str | None:
    """``name`` or its nearest enclosing module that is one of ``modules``."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imported_names(path: Path, modules: set[str], root: Path, *, module_level: bool = False) -> set[str]:
    """What the file at ``path`` imports, as written: ``import a.b`` as ``a.b``, ``from pkg import x`` as
    ``pkg.x`` when that is one of ``modules`` (a submodule), else as ``pkg``; in a file that calls
    ``import_module``, each string naming one of ``modules`` (``core.x``, or ``core.x:Name`` as the backend
    catalog writes its entries). ``module_level``: only what runs when the module is imported (no imports
    inside functions, no strings: those are imported when a function asks)."""
    name = module_name(path, root)
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    if module_level:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                skipped.update(id(n) for n in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node, path.name == "__init__.py")
            if target is not None:
                found.update(sub if (sub := f"{target}.{alias.name}") in modules else target for alias in node.names)
    if not module_level and _calls_import_module(tree, skipped):
        strings = (node.value.partition(":")[0] for node in ast.walk(tree) if id(node) not in skipped
                   and isinstance(node, ast.Constant) and isinstance(node.value, str))
        found.update(value for value in strings if "." in value and value in modules)  # not a folder named "core"
    return found - {name}


def imports_of(path: Path, modules: set[str], root: Path, *, module_level: bool = False) -> set[str]:
    """The modules of ``modules`` that the file at ``path`` imports (a name in a module counts as the module)."""
    name = module_name(path, root)
    resolved = {_known(m, modules) for m in imported_names(path, modules, root, module_level=module_level)}
    return {m for m in resolved if m is not None and m != name}


def module_graph(root: Path = ROOT, trees: tuple[str, ...] = TREES, *,
                 module_level: bool = False) -> dict[str, set[str]]:
    """Module → the modules of ``trees`` it imports (``module_level``: see ``imported_names``)."""
    files = {module_name(p, root): p for tree in trees for p in sorted((root / tree).rglob("*.py"))}
    modules = set(files)
    return {name: imports_of(path, modules, root, module_level=module_level) for name, path in files.items()}


def package_of(module: str, root: Path = ROOT) -> str:
    """The node a module belongs to: ``core/<package>``, ``adapters/<folder>``, or its top-level group."""
    parts = module.split(".")
    if len(parts) >= 2 and (root / parts[0] / parts[1]).is_dir():
        return f"{parts[0]}/{parts[1]}"
    if len(parts) == 1:
        return f"{parts[0]}/__init__.py"
    for group, names in TOP_LEVEL.items():
        if parts[0] == "core" and parts[1] in names:
            return group
    return "/".join(parts) + ".py"


def package_graph(root: Path = ROOT, trees: tuple[str, ...] = TREES, *,
                  module_level: bool = False) -> dict[str, set[str]]:
    """Node → the other nodes it imports (a node that neither imports nor is imported, such as a package
    ``__init__`` holding only its docstring, is left out)."""
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph(root, trees, module_level=module_level).items():
        node = package_of(module, root)
        graph.setdefault(node, set()).update(package_of(t, root) for t in targets)
    for node, targets in graph.items():
        targets.discard(node)
    imported = set().union(*graph.values())
    return {node: targets for node, targets in graph.items() if targets or node in imported}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cycle_errors(root: Path = ROOT, trees: tuple[str, ...] = TREES) -> list[str]:
    """One line per cycle: between modules through every import, between the picture's nodes through the
    imports that run at import."""
    modules = [f"modules import each other: {' ↔ '.join(c)}" for c in cycles(module_graph(root, trees))]
    nodes = [f"packages import each other at import: {' ↔ '.join(c)}"
             for c in cycles(package_graph(root, trees, module_level=True))]
    return modules + nodes


def _node_id(node: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in node)


def mermaid(graph: dict[str, set[str]]) -> str:
    """A ``flowchart TB``: one node per package, one arrow per importing pair (importer → imported)."""
    lines = ["flowchart TB"]
    for node in sorted(graph):
        lines.append(f'  {_node_id(node)}["{node}"]')
    for node in sorted(graph):
        for target in sorted(graph[node]):
            lines.append(f"  {_node_id(node)} --> {_node_id(target)}")
    return "\n".join(lines)


def groups(root: Path = ROOT) -> dict[str, list[str]]:
    """Each group of ``TOP_LEVEL`` → the files of it that exist under ``core/``."""
    return {group: [f"{name}.py" for name in names if (root / "core" / f"{name}.py").is_file()]
            for group, names in TOP_LEVEL.items()}


def block(graph: dict[str, set[str]], members: dict[str, list[str]] | None = None) -> str:
    """The text between the markers: the Mermaid picture, then the same edges as a list and what each
    group of top-level modules holds."""
    rows = [f"{node:<26} → {', '.join(sorted(graph[node])) or '—'}" for node in sorted(graph)]
    legend = [f"{group:<26} = {', '.join(files)}" for group, files in (members or {}).items()
              if group in graph and files]
    return ("```mermaid\n" + mermaid(graph) + "\n```\n\n"
            "The same, as text (each package → the packages it imports), and the modules of each group:\n\n"
            "```text\n" + "\n".join(rows + ([""] + legend if legend else [])) + "\n```")


def replace_block(text: str, new: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"{DOC}: the markers {START} and {END} are missing")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{new}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the block into docs/architecture.md")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 when docs/architecture.md's block is stale or the imports form a cycle")
    p.add_argument("--root", type=Path, default=ROOT, help="the tree to read (default: this checkout)")
    args = p.parse_args(argv)
    root = args.root.resolve()
    doc = root / DOC.relative_to(ROOT)
    new = block(package_graph(root), groups(root))
    if not (args.write or args.check):
        print(new)
        return 0
    text = doc.read_text()
    updated = replace_block(text, new)
    if args.check:
        errors = cycle_errors(root)
        if updated != text:
            errors.append(f"{doc.relative_to(root)}: the import graph differs from the code; "
                          "run .venv/bin/python scripts/import_graph.py --write")
        for line in errors:
            print(line, file=sys.stderr)
        return 1 if errors else 0
    doc.write_text(updated)
    print(f"wrote the import graph into {doc.relative_to(root)}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
