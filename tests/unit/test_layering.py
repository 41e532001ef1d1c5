"""The import graph of ``core``: no module imports itself back through others, a few layers never
import the ones above them, and the library tier imports no HTTP module. Read from the source with ``ast``
(every ``import``, module-level and inside functions, and the modules named by strings in a module that calls
``importlib.import_module``, such as ``core/backends/catalog.py``'s ``"core.backends.onnx:OnnxBackend"``;
imports under ``if TYPE_CHECKING:`` are left out, they never run). Also: every backend of the catalog
declares its name, extra and files."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.modules import load_script
from tests.support.server import ROOT

_reader = load_script("import_graph")

CORE = ROOT / "core"

#: (importer, imported): modules under the first never import modules under the second
FORBIDDEN = (
    ("core.config", "core.backends.registry"),  # the spec reads the backends' declarations, never the chooser
    ("core.hub", "core.backends.registry"),
    ("core.backends.catalog", "core.config"),
    ("core.loading", "core.backends"),
)
#: the same, for module-level imports only (a function may reach them lazily)
FORBIDDEN_AT_MODULE_LEVEL = (
    ("core.backends", "core.convert"),  # serving code does not load the converters
)

#: the HTTP tier: the API and the entry points that start its server. Every other module of ``core`` is the
#: library tier (serving, engine, tasks, backends, bulk, cache, the in-process API ...), usable without HTTP
HTTP_TIER = ("core.api", "core.cli", "core.dev")
#: what the library tier never imports
HTTP_MODULES = ("fastapi", "starlette", "uvicorn", "mangum", "core.api")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_name(path: Path, root: Path = ROOT) -> str:
    return _reader.module_name(path, root)


def all_imports_of(path: Path, modules: set[str] = frozenset(), root: Path = ROOT, *,
                   module_level: bool = False) -> set[str]:
    """Every module the file at ``path`` imports, of any package, read as the import-graph script reads it
    (``_reader.imported_names``)."""
    return _reader.imported_names(path, modules, root, module_level=module_level)


def imports_of(path: Path, modules: set[str], root: Path = ROOT, *, module_level: bool = False) -> set[str]:
    """The modules of ``modules`` the file at ``path`` imports."""
    return _reader.imports_of(path, modules, root, module_level=module_level)


def http_imports(package: Path = CORE) -> list[str]:
    """``"importer imports imported"`` for each HTTP module a library-tier module of ``package`` imports."""
    root = package.parent
    files = {module_name(p, root): p for p in sorted(package.rglob("*.py"))}
    return [f"{name} imports {imported}" for name, path in files.items() if not _within(name, HTTP_TIER)
            for imported in sorted(all_imports_of(path, set(files), root)) if _within(imported, HTTP_MODULES)]


def import_graph(package: Path = CORE, *, module_level: bool = False) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports (``module_level``: see ``imports_of``)."""
    root = package.parent
    files = {module_name(p, root): p for p in sorted(package.rglob("*.py"))}
    modules = set(files)
    return {name: imports_of(path, modules, root, module_level=module_level) for name, path in files.items()}


cycles = _reader.cycles  # the strongly connected components of more than one module, as --check finds them


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "core.engine" in graph and "core.convert.onnx_export" in graph
    assert "core.backends.registry" in graph["core.engine"]  # module level: from core.backends.registry import …
    assert "core.convert.export_cache" in graph["core.backends.registry"]  # inside choose()
    assert "core.config" not in graph["core.hub"]  # only under TYPE_CHECKING
    # the catalog names its backends as strings for importlib.import_module: those count
    assert {"core.backends.torch", "core.backends.onnx", "core.backends.ct2", "core.backends.neuron"} <= graph[
        "core.backends.catalog"]
    at_import = import_graph(module_level=True)
    assert "core.convert.export_cache" not in at_import["core.backends.registry"]
    assert "core.backends.catalog" in at_import["core.config"]


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


def test_importlib_strings_count_and_their_cycles_are_found(tmp_path):
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "names.py").write_text('import importlib\nPLUGINS = {"a": "core.plugin:Plugin"}\n'
                                  'def load(n):\n    return importlib.import_module(PLUGINS[n].split(":")[0])\n'
                                  'NOT_A_MODULE = "core.nothing"\n')
    (pkg / "plugin.py").write_text("def f():\n    from core import names\n")
    (pkg / "plain.py").write_text('TEXT = "core.plugin"\n')  # no import_module here: a plain string
    graph = import_graph(pkg)
    assert graph["core.names"] == {"core.plugin"} and graph["core.plain"] == set()
    assert cycles(graph) == [["core.names", "core.plugin"]]
    assert import_graph(pkg, module_level=True)["core.names"] == set()


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


def test_lower_layers_never_import_upper_ones_at_module_level():
    graph = import_graph(module_level=True)
    bad = [f"{importer} imports {imported} at module level" for importer, targets in sorted(graph.items())
           for imported in sorted(targets)
           for low, high in FORBIDDEN_AT_MODULE_LEVEL
           if (importer == low or importer.startswith(low + ".")) and (imported == high or imported.startswith(high + "."))]
    assert not bad, bad


def _catalog() -> dict[str, str]:
    from core.backends.catalog import BACKENDS

    return dict(BACKENDS)


@pytest.mark.parametrize("name", list(_catalog()))
def test_each_backend_declares_its_name_extra_and_files(name):
    """Each backend of the one list declares what the registry, the Hub download and ``auto`` ask of it, and
    imports neither the registry that loads it nor the spec (which reads its options)."""
    from core.backends.base import Backend
    from core.backends.catalog import backend_class

    cls = backend_class(name)
    assert cls.name == name
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert cls.extra in extras, f"{name}: extra {cls.extra!r} is not an extra of pyproject.toml"
    assert cls.files.__func__ is not Backend.files.__func__, f"{name}: declares no files"
    assert cls.files([], dtype="float32", options=None) == []  # an empty folder has nothing it runs
    assert cls.Options is None or set(cls.Options.flat.values()) <= set(cls.Options.model_fields)
    module = _catalog()[name].partition(":")[0]
    reached = import_graph()[module]
    assert not reached & {"core.backends.registry", "core.config", "core.engine", "core.hub"}, reached


def test_reading_the_declarations_imports_no_runtime():
    """``core.config`` builds the spec from every backend's options: that imports each backend module, and
    none of their runtimes (a process serving ONNX never imports torch)."""
    code = ("import sys, core.config, core.hub, core.backends.catalog as c\n"
            "[c.backend_class(n) for n in c.names()]\n"
            "print(sorted(m for m in ('torch', 'onnxruntime', 'ctranslate2', 'optimum', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
