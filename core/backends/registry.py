"""The one place that chooses a backend. Backends are imported on demand, so a process that serves
ONNX never imports torch."""

from __future__ import annotations

import importlib
from pathlib import Path

from core.backends.base import Backend
from core.config import ModelSpec
from core.errors import InvalidInput, MissingDependency

# name → (module, class, extra that installs it)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "torch": ("core.backends.torch", "TorchBackend", "torch"),
    "onnx": ("core.backends.onnx", "OnnxBackend", "onnx"),
    "ct2": ("core.backends.ct2", "CT2Backend", "ct2"),
    "neuron": ("core.backends.neuron", "NeuronBackend", "neuron"),
}


def onnx_graph_names(dtype: str) -> tuple[str, ...]:
    """The ONNX graphs looked for in a model folder (or a Hub repository) for ``dtype``, first choice first."""
    if dtype == "int8":
        return ("onnx/model_int8.onnx", "onnx/model_quantized.onnx", "model_int8.onnx", "model_quantized.onnx")
    if dtype in ("float16", "fp16"):
        return ("onnx/model_fp16.onnx", "model_fp16.onnx")
    return ("onnx/model.onnx", "model.onnx")


def onnx_file_for(spec: ModelSpec) -> Path | None:
    """The ONNX graph a spec points at, if any: ``onnx_file``, else in the folder ``onnx/model.onnx`` or
    ``model.onnx`` (with ``dtype: int8``: ``onnx/model_int8.onnx`` or ``onnx/model_quantized.onnx``)."""
    if spec.onnx_file is not None:
        return Path(spec.onnx_file)
    for candidate in (spec.path / name for name in onnx_graph_names(spec.dtype)):
        if candidate.exists():
            return candidate
    return None


def resolve_name(spec: ModelSpec) -> str:
    """``auto`` → the first artifact the folder carries: ``neuron/manifest.json`` (compiled Neuron buckets)
    → neuron; an ONNX graph → onnx; ``ct2/model.bin`` → ct2; else torch. See docs/backends.md."""
    if spec.backend != "auto":
        if spec.backend not in BACKENDS:
            raise InvalidInput(f"unknown backend {spec.backend!r}; known: {sorted(BACKENDS)}")
        return spec.backend
    if (spec.path / "neuron" / "manifest.json").exists():
        return "neuron"
    if onnx_file_for(spec) is not None:
        return "onnx"
    if (spec.path / "ct2" / "model.bin").exists():
        return "ct2"
    return "torch"


def create_backend(spec: ModelSpec) -> Backend:
    name = resolve_name(spec)
    module_name, class_name, extra = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingDependency(
            f"backend {name!r} needs the extra [{extra}]: pip install 'tessera[{extra}]' ({exc})"
        ) from exc
    return getattr(module, class_name).from_spec(spec)
