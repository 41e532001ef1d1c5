"""The one place that chooses a backend. Backends are imported on demand, so a process that serves
ONNX never imports torch.

``choose`` turns a model spec into a :class:`Choice` (the backend, why, and the graph to run when one
comes from the export cache); ``create_backend`` builds it. An explicit ``backend`` is honoured exactly
or refused with what is missing and the command that makes it; ``auto`` picks the fastest backend that
the folder (or the export cache) can run with parity, see docs/backends.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

from core.backends.base import Backend
from core.backends.heads import get_head
from core.config import ModelSpec
from core.errors import InvalidInput, MissingDependency, Unsupported, install_hint
from core.loading import (ONNX_DTYPE_ALIASES, ONNX_GRAPHS, PARITY_RECORD, checked_with_own_code, custom_code,
                          onnx_graph_names)

log = logging.getLogger(__name__)

# name → (module, class, extra that installs it)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "torch": ("core.backends.torch", "TorchBackend", "torch"),
    "onnx": ("core.backends.onnx", "OnnxBackend", "onnx"),
    "ct2": ("core.backends.ct2", "CT2Backend", "ct2"),
    "neuron": ("core.backends.neuron", "NeuronBackend", "neuron"),
}



@dataclass(frozen=True)
class Choice:
    """What serves a model and why (the start-up log and ``/v1/models`` show both)."""

    backend: str
    reason: str
    #: the graph to run when it is not the folder's own (the export cache's)
    onnx_file: Path | None = None
    #: True when a faster backend was meant but could not be had (export or its check failed)
    fell_back: bool = False
    #: the dtype chosen for a spec that named none (on an accelerator, ``core.backends.precision``)
    dtype: str | None = None


def onnx_file_for(spec: ModelSpec) -> Path | None:
    """The ONNX graph a spec points at, if any: ``onnx_file`` (relative paths are resolved against the
    model folder), else the folder's graph for the dtype (``core.loading.ONNX_GRAPHS``): ``onnx/model.onnx`` or
    ``model.onnx``; ``dtype: int8`` → ``onnx/model_int8.onnx`` / ``onnx/model_quantized.onnx``;
    ``float16`` → ``onnx/model_fp16.onnx``. Never a graph of another precision."""
    if spec.onnx_file is not None:
        return Path(spec.onnx_file)
    for candidate in (spec.path / name for name in onnx_graph_names(spec.dtype)):
        if candidate.exists():
            return candidate
    return None


def missing_graph_message(spec: ModelSpec) -> str:
    """What is missing for ``backend: onnx`` at this dtype, and the command that makes it."""
    dtype = ONNX_DTYPE_ALIASES.get(spec.dtype, spec.dtype)
    if spec.onnx_file is not None:
        return f"model {spec.served_name!r}: onnx_file {spec.onnx_file} does not exist"
    names = onnx_graph_names(dtype)
    flag = {"int8": " --int8 fast", "float16": " --fp16"}.get(dtype, "")
    have = [n for graphs in ONNX_GRAPHS.values() for n in graphs if (spec.path / n).exists()]
    found = f"; the folder has {', '.join(have)} (another precision)" if have else ""
    short = {"float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
    return (f"model {spec.served_name!r}: no {short} ONNX graph in {spec.path} (looked for {', '.join(names)}){found}; "
            f"make one with `python scripts/export_onnx.py {spec.path} OUT{flag}` and serve OUT, "
            f"or name a graph with onnx_file")


def _has_onnxruntime() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def _has_ctranslate2() -> bool:
    return importlib.util.find_spec("ctranslate2") is not None


def choose(spec: ModelSpec, *, head: str | None = None, cache_dir: Path | None = None,
           auto_export: bool = True, threads: int = 1) -> Choice:
    """The backend for a spec. ``head``: the head the task runs (needed to export or measure); ``cache_dir``
    and ``auto_export``: the settings of the export cache; ``threads``: the runtime threads of a measurement."""
    from core.export_cache import ExportUnavailable, cached_or_export, has_torch_weights

    torch_only = get_head(head).torch_only if head is not None else None
    if spec.backend != "auto":
        if spec.backend not in BACKENDS:
            raise InvalidInput(f"unknown backend {spec.backend!r}; known: {sorted(BACKENDS)}")
        if torch_only and spec.backend != "torch":
            raise Unsupported(f"model {spec.served_name!r} is {torch_only}, so backend {spec.backend!r} would "
                              "compute other vectors or none; serve it with backend 'torch' (or 'auto')",
                              code="unsupported_architecture")
        if spec.backend == "onnx" and not onnx_graph_names(spec.dtype):
            raise InvalidInput(f"onnx backend: dtype {spec.dtype!r} not supported; use one of "
                               f"{sorted([*ONNX_GRAPHS, *ONNX_DTYPE_ALIASES])}")
        if spec.backend == "onnx" and onnx_file_for(spec) is None:
            raise InvalidInput(missing_graph_message(spec))
        check_own_code_artifact(spec)
        return Choice(spec.backend, "set in the model spec")
    if torch_only:  # before the folder's artifacts: none of them computes this head
        return Choice("torch", f"{torch_only}: torch")
    kind = spec.device.partition(":")[0]
    if (spec.path / "neuron" / "manifest.json").exists() and kind != "cuda":
        return Choice("neuron", "the folder holds compiled Neuron buckets (neuron/manifest.json)")
    if kind == "neuron":  # a Neuron device runs compiled buckets only: neither ONNX Runtime nor torch serve it
        raise InvalidInput(f"model {spec.served_name!r}: device 'neuron' serves compiled Neuron buckets, and "
                           f"{spec.path} has none (no neuron/manifest.json); compile them with "
                           f"`python scripts/compile_neuron.py {spec.path} OUT` and serve OUT")
    own_code = custom_code(_config(spec.path))
    if own_code is not None:  # before the folder's artifacts: only those converted from its own code serve it
        return _own_code_choice(spec, own_code)
    graph = onnx_file_for(spec)
    if graph is not None:
        shown = graph.relative_to(spec.path) if graph.is_relative_to(spec.path) else graph
        return Choice("onnx", f"the folder has an ONNX graph for {spec.dtype} ({shown})")
    weights = has_torch_weights(spec.path)
    # a CTranslate2 model where its runtime is installed; without it (e.g. the SageMaker images) the folder's
    # torch weights serve, and a folder with nothing else fails on the ct2 backend, naming its extra
    if (spec.path / "ct2" / "model.bin").exists() and (_has_ctranslate2() or not weights):
        return Choice("ct2", "the folder holds a CTranslate2 model (ct2/model.bin)")
    if not weights:
        if any((spec.path / n).exists() for graphs in ONNX_GRAPHS.values() for n in graphs):
            raise InvalidInput(missing_graph_message(spec) + " (the folder has no torch weights to fall back on)")
        if (spec.path / "neuron" / "manifest.json").exists():
            return Choice("torch", f"compiled Neuron buckets do not run on {spec.device}, and the folder has no "
                                   "ONNX or CTranslate2 artifact")
        return Choice("torch", "no ONNX, CTranslate2 or Neuron artifact in the folder")
    if kind == "cuda" and head is not None and not spec.dtype_is_set:
        from core.backends.precision import cuda_candidates, fastest

        cache_dir = cache_dir if cache_dir is not None else _default_cache_dir()
        candidates, notes = cuda_candidates(spec, head, cache_dir, auto_export)
        verdict = fastest(spec, head, candidates, load=lambda c: load_candidate(spec, c, head, threads),
                          cache_dir=cache_dir, notes=notes)
        return Choice(verdict.backend, verdict.reason, onnx_file=verdict.onnx_file, fell_back=verdict.fell_back,
                      dtype=verdict.dtype)
    if spec.device != "cpu":
        return Choice("torch", f"auto on {spec.device} with dtype {spec.dtype}: torch"
                      if spec.dtype_is_set else f"auto on {spec.device}: torch")
    if ONNX_DTYPE_ALIASES.get(spec.dtype, spec.dtype) != "float32":
        return Choice("torch", f"no {spec.dtype} ONNX graph in the folder and only float32 is exported "
                               f"automatically (for ONNX {spec.dtype}: scripts/export_onnx.py)")
    if not auto_export:
        return Choice("torch", "no ONNX graph in the folder and auto_export is off (TESSERA_AUTO_EXPORT=false)")
    if spec.trust_remote_code:
        return Choice("torch", "the model runs its own code (trust_remote_code): not exported")
    if head is None:
        return Choice("torch", "no ONNX graph in the folder")
    if not _has_onnxruntime():
        return Choice("torch", f"onnxruntime is not installed ({install_hint('onnx')})", fell_back=True)
    if cache_dir is None:
        cache_dir = _default_cache_dir()
    try:
        cached = cached_or_export(spec.path, head=head, cache_dir=cache_dir, max_length=spec.max_length,
                                  name=spec.served_name)
    except ExportUnavailable as exc:
        return Choice("torch", f"ONNX export not used: {exc}", fell_back=True)
    worst = min(cached.min_cosine.values()) if cached.min_cosine else float("nan")
    how = "exported now" if cached.exported_now else "from the export cache"
    return Choice("onnx", f"ONNX Runtime on CPU, graph {how} ({cached.path.parent}), worst cosine vs torch "
                          f"{worst:.6f}", onnx_file=cached.path)


def _config(folder: Path) -> dict:
    import json

    try:
        return json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _ct2_model(folder: Path) -> Path | None:
    for candidate in (Path(folder) / "ct2" / "model.bin", Path(folder) / "model.bin"):
        if candidate.exists():
            return candidate
    return None


def check_own_code_artifact(spec: ModelSpec) -> None:
    """``backend: onnx`` / ``ct2`` for a model with its own code (config ``auto_map``): the graph or the
    CTranslate2 model must come from that code — recorded in the ``parity.json`` the converters write when run
    with ``--trust-remote-code`` — or, for ONNX, be named by the spec's ``onnx_file`` (e.g. the model
    publisher's own export). A conversion through transformers' built-in class of the model's ``model_type``
    computes something else (jina-embeddings-v3 without its task adapters), so it is refused, never served."""
    code = custom_code(_config(spec.path))
    if code is None or spec.backend not in ("onnx", "ct2") or (spec.backend == "onnx" and spec.onnx_file is not None):
        return
    artifact = onnx_file_for(spec) if spec.backend == "onnx" else _ct2_model(spec.path)
    if artifact is None or checked_with_own_code(artifact):
        return  # none: the backend's own message names what is missing
    script = "export_onnx.py" if spec.backend == "onnx" else "convert_ct2.py"
    raise Unsupported(
        f"model {spec.served_name!r} runs its own code ({code}), and {artifact} is not recorded as converted from "
        f"that code (no {artifact.parent / PARITY_RECORD} naming it): a conversion through transformers' built-in "
        f"class gives different vectors. Convert it with `python scripts/{script} {spec.path} OUT "
        "--trust-remote-code` (checked against the model's own code) and serve OUT"
        + (", name a graph made from the model's own code with onnx_file" if spec.backend == "onnx" else "")
        + ", or serve it with backend torch", code="custom_code")


def _own_code_choice(spec: ModelSpec, code: str) -> Choice:
    """``auto`` for a model with its own code: an artifact converted from that code (``parity.json``) or named
    by the spec, else torch (the export cache converts with transformers' built-in classes only)."""
    graph = onnx_file_for(spec)
    if graph is not None and (spec.onnx_file is not None or checked_with_own_code(graph)):
        return Choice("onnx", f"the model runs its own code ({code}) and the folder's ONNX graph was exported from "
                              f"it ({graph.name}, {PARITY_RECORD})")
    ct2 = _ct2_model(spec.path)
    if ct2 is not None and checked_with_own_code(ct2) and _has_ctranslate2():
        return Choice("ct2", f"the model runs its own code ({code}) and the folder's CTranslate2 model matched it "
                             f"({PARITY_RECORD})")
    found = [p for p in (graph, ct2) if p is not None]
    why = (f"{', '.join(str(p.relative_to(spec.path)) for p in found)} not recorded as converted from that code "
           f"({PARITY_RECORD}), so not served" if found else "not exported (the export cache runs transformers' "
           "built-in classes only)")
    return Choice("torch", f"the model runs its own code ({code}, trust_remote_code): {why}")


def _default_cache_dir() -> Path:
    from core.config import default_cache_dir

    return default_cache_dir()


def resolve_name(spec: ModelSpec) -> str:
    """The backend ``auto`` picks from the folder alone (no export): see ``choose``."""
    return choose(spec, auto_export=False).backend


def create_backend(spec: ModelSpec, choice: Choice | None = None) -> Backend:
    """Build the chosen backend (``choose(spec)`` without an export when no choice is given)."""
    choice = choice or choose(spec, auto_export=False)
    module_name, class_name, extra = BACKENDS[choice.backend]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingDependency(f"backend {choice.backend!r} needs the extra [{extra}]: {install_hint(extra)} ({exc})") from exc
    if choice.onnx_file is not None:
        spec = spec.model_copy(update={"onnx_file": choice.onnx_file})
    return getattr(module, class_name).from_spec(spec)


def load_candidate(spec: ModelSpec, candidate, head: str, threads: int) -> Backend:
    """A backend of ``candidate`` (a ``core.backends.precision.Candidate``: backend, dtype, graph) loaded on
    the spec's device, for measuring it."""
    choice = Choice(candidate.backend, "measuring", onnx_file=candidate.onnx_file)
    backend = create_backend(spec.model_copy(update={"dtype": candidate.dtype}), choice)
    backend.load(spec.path, head=head, device=spec.device, dtype=candidate.dtype, threads=threads)
    return backend
