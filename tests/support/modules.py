"""Python files loaded by path: the Lambda handler and the Modal app (platform entry files) and the
command lines in scripts/, none of them on a package path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.support.server import ROOT


def load_by_path(name: str, path: Path, *, register: bool = False) -> ModuleType:
    """Execute ``path`` as a module named ``name``; ``register``: put it in ``sys.modules`` first (where
    dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_script(name: str) -> ModuleType:
    """``scripts/NAME.py`` as a module (its ``main`` and helpers, called in-process)."""
    return load_by_path(f"tessera_script_{name}", ROOT / "scripts" / f"{name}.py", register=True)
