"""The one list of backends: each name and the class that declares it (``module:Class``). A new backend
is a module under ``core/backends/`` plus one line here; the registry, the spec (``ModelSpec``'s nested
options), the Hub download, the command line and the docs ask this list.

The modules are imported on demand (``backend_class``): each imports no runtime at module level, so
reading a declaration never imports torch, onnxruntime or ctranslate2.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from core.errors import InvalidInput

if TYPE_CHECKING:
    from core.backends.base import Backend, BackendOptions

#: name → ``module:Class``, in the order docs and help list them
BACKENDS: dict[str, str] = {
    "torch": "core.backends.torch:TorchBackend",
    "onnx": "core.backends.onnx:OnnxBackend",
    "ct2": "core.backends.ct2:CT2Backend",
    "neuron": "core.backends.neuron:NeuronBackend",
}


def names() -> tuple[str, ...]:
    """The backends a spec may name besides ``auto``."""
    return tuple(BACKENDS)


def backend_class(name: str) -> "type[Backend]":
    """The class that declares backend ``name``; ``InvalidInput`` naming the known ones otherwise."""
    if name not in BACKENDS:
        raise InvalidInput(f"unknown backend {name!r}; known: {sorted(BACKENDS)}")
    module, _, attr = BACKENDS[name].partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if cls.name != name:
        raise TypeError(f"{BACKENDS[name]} declares name {cls.name!r}, listed as {name!r}")
    return cls


def backend_classes() -> "list[type[Backend]]":
    return [backend_class(name) for name in BACKENDS]


def options_models() -> "dict[str, type[BackendOptions]]":
    """Backend name → its spec options model, for the backends that declare one (``ModelSpec`` nests each
    under the backend's name)."""
    return {cls.name: cls.Options for cls in backend_classes() if cls.Options is not None}


#: the backend ``auto`` falls back on when no other serves the folder: it runs the model's own weights
FALLBACK = "torch"


def auto_order() -> "list[type[Backend]]":
    """The backends ``auto`` asks whether they serve a folder, in their declared order (``Backend.auto_order``;
    those without one are never chosen from the folder's files)."""
    return sorted((c for c in backend_classes() if c.auto_order is not None), key=lambda c: c.auto_order)
