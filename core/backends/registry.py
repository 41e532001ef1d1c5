"""The one place that chooses a backend. Backends are imported on demand, so a process that serves
ONNX never imports torch.

``choose`` turns a model spec into a :class:`Choice` (the backend, why, and the graph to run when one
comes from the export cache); ``create_backend`` builds it. An explicit ``backend`` is honoured exactly
or refused with what is missing and the command that makes it; ``auto`` picks the fastest backend that
the folder (or the export cache) can run with parity, see docs/backends.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.backends.base import Backend, Folder, device_kind, folder_files
from core.backends.catalog import FALLBACK, auto_order, backend_class
from core.backends.heads import get_head
from core.errors import InvalidInput, MissingDependency, Unsupported, install_hint
from core.loading import PARITY_RECORD, custom_code

if TYPE_CHECKING:  # annotations only: the spec's module imports the backends' catalog
    from core.config import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    """What serves a model and why (the start-up log and ``/v1/models`` show both)."""

    backend: str
    reason: str
    #: the file to run when it is not the folder's own (the export cache's ONNX graph)
    artifact: Path | None = None
    #: True when a faster backend was meant but could not be had (export or its check failed)
    fell_back: bool = False
    #: the dtype chosen for a spec that named none (on an accelerator, ``core.backends.precision``)
    dtype: str | None = None


def choose(spec: ModelSpec, *, head: str | None = None, cache_dir: Path | None = None,
           auto_export: bool = True, threads: int = 1) -> Choice:
    """The backend for a spec. ``head``: the head the task runs (needed to export or measure); ``cache_dir``
    and ``auto_export``: the settings of the export cache; ``threads``: the runtime threads of a measurement.

    ``auto`` asks each backend in turn whether it serves the folder on the device (``Backend.can_serve``,
    in their declared order); when none does, the fallback (torch) serves the model's own weights, or an
    artifact made from them: on CUDA the fastest verified precision, on a CPU an ONNX graph from the
    export cache."""
    torch_only = get_head(head).torch_only if head is not None else None
    if spec.backend != "auto":
        cls = backend_class(spec.backend)
        if torch_only and spec.backend != FALLBACK:
            raise Unsupported(f"model {spec.served_name!r} is {torch_only}, so backend {spec.backend!r} would "
                              f"compute other vectors or none; serve it with backend {FALLBACK!r} (or 'auto')",
                              code="unsupported_architecture")
        cls.check_spec(spec)
        check_own_code_artifact(spec)
        return Choice(spec.backend, "set in the model spec")
    if torch_only:  # before the folder's artifacts: none of them computes this head
        return Choice(FALLBACK, f"{torch_only}: {FALLBACK}")
    config = _config(spec.path)
    files = folder_files(spec.path)
    fallback = backend_class(FALLBACK)
    weights = bool(fallback.files(files, dtype=spec.dtype, options=fallback.options_of(spec)))
    folder = Folder(spec.path, files, own_code=custom_code(config), has_fallback_weights=weights)
    others = [cls for cls in auto_order() if cls.name != FALLBACK]
    for cls in others:
        reason = cls.can_serve(spec, folder)
        if reason is not None:
            return Choice(cls.name, reason)
    if folder.own_code is not None:  # only artifacts converted from its own code serve it (none did)
        return _own_code_fallback(spec, folder, others)
    if not weights:
        for cls in others:
            why = cls.cannot_serve(spec, folder)
            if why is not None:
                raise InvalidInput(why + f" (the folder has no {fallback.artifact_label} to fall back on)")
        labels = [c.artifact_label for c in others]
        return Choice(FALLBACK, f"no {' or '.join(filter(None, [', '.join(labels[:-1]), labels[-1]]))} in the folder")
    return _fallback_or_export(spec, head, cache_dir, auto_export, threads)


def _fallback_or_export(spec: ModelSpec, head: str | None, cache_dir: Path | None, auto_export: bool,
                        threads: int) -> Choice:
    """A folder with torch weights and no artifact that serves it: on CUDA with no dtype set, the fastest
    verified precision; elsewhere torch, or on a CPU the ONNX graph the export cache makes."""
    if device_kind(spec.device) == "cuda" and head is not None and not spec.dtype_is_set:
        from core.backends.precision import cuda_candidates, fastest

        cache_dir = cache_dir if cache_dir is not None else _default_cache_dir()
        candidates, notes = cuda_candidates(spec, head, cache_dir, auto_export)
        verdict = fastest(spec, head, candidates, load=lambda c: load_candidate(spec, c, head, threads),
                          cache_dir=cache_dir, notes=notes)
        return Choice(verdict.backend, verdict.reason, artifact=verdict.onnx_file, fell_back=verdict.fell_back,
                      dtype=verdict.dtype)
    if spec.device != "cpu":
        return Choice("torch", f"auto on {spec.device} with dtype {spec.dtype}: torch"
                      if spec.dtype_is_set else f"auto on {spec.device}: torch")
    from core.backends.onnx import ONNX_DTYPE_ALIASES, OnnxBackend

    if ONNX_DTYPE_ALIASES.get(spec.dtype, spec.dtype) != "float32":
        return Choice("torch", f"no {spec.dtype} ONNX graph in the folder and only float32 is exported "
                               f"automatically (for ONNX {spec.dtype}: scripts/export_onnx.py)")
    if not auto_export:
        return Choice("torch", "no ONNX graph in the folder and auto_export is off (TESSERA_AUTO_EXPORT=false)")
    if spec.trust_remote_code:
        return Choice("torch", "the model runs its own code (trust_remote_code): not exported")
    if head is None:
        return Choice("torch", "no ONNX graph in the folder")
    if not OnnxBackend.installed():
        return Choice("torch", f"onnxruntime is not installed ({install_hint('onnx')})", fell_back=True)
    from core.convert.export_cache import ExportUnavailable, cached_or_export

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
                          f"{worst:.6f}", artifact=cached.path)


def _config(folder: Path) -> dict:
    try:
        return json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def check_own_code_artifact(spec: ModelSpec) -> None:
    """An explicit backend that runs a converted artifact (``Backend.own_code_converter``: ONNX, CTranslate2)
    for a model with its own code (config ``auto_map``): the artifact must come from that code — recorded in
    the ``parity.json`` the converters write when run with ``--trust-remote-code`` — or, for ONNX, be named
    by the spec's ``onnx.file`` (e.g. the model publisher's own export). A conversion through transformers'
    built-in class of the model's ``model_type`` computes something else (jina-embeddings-v3 without its task
    adapters), so it is refused, never served."""
    code = custom_code(_config(spec.path))
    cls = backend_class(spec.backend)
    if code is None or cls.own_code_converter is None:
        return
    artifact = cls.artifact(spec.path, dtype=spec.dtype, options=cls.options_of(spec))
    if artifact is None or cls.converted_from_own_code(spec, artifact):
        return  # none: the backend's own message names what is missing
    named = cls.Options is not None and "file" in cls.Options.model_fields
    raise Unsupported(
        f"model {spec.served_name!r} runs its own code ({code}), and {artifact} is not recorded as converted from "
        f"that code (no {artifact.parent / PARITY_RECORD} naming it): a conversion through transformers' built-in "
        f"class gives different vectors. Convert it with `python {cls.own_code_converter} {spec.path} OUT "
        "--trust-remote-code` (checked against the model's own code) and serve OUT"
        + (f", name a graph made from the model's own code with {cls.name}.file" if named else "")
        + ", or serve it with backend torch", code="custom_code")


def _own_code_fallback(spec: ModelSpec, folder: Folder, others: list[type[Backend]]) -> Choice:
    """``auto`` for a model with its own code that no converted artifact serves: torch (the export cache
    converts with transformers' built-in classes only), naming the artifacts found and not used."""
    found = [p for p in (cls.artifact(spec.path, dtype=spec.dtype, options=cls.options_of(spec), listing=folder.files)
                         for cls in others if cls.own_code_converter is not None) if p is not None]
    why = (f"{', '.join(str(p.relative_to(spec.path)) for p in found)} not recorded as converted from that code "
           f"({PARITY_RECORD}), so not served" if found else "not exported (the export cache runs transformers' "
           "built-in classes only)")
    return Choice(FALLBACK, f"the model runs its own code ({folder.own_code}, trust_remote_code): {why}")


def _default_cache_dir() -> Path:
    from core.config import default_cache_dir

    return default_cache_dir()


def resolve_name(spec: ModelSpec) -> str:
    """The backend ``auto`` picks from the folder alone (no export): see ``choose``."""
    return choose(spec, auto_export=False).backend


def create_backend(spec: ModelSpec, choice: Choice | None = None) -> Backend:
    """Build the chosen backend (``choose(spec)`` without an export when no choice is given)."""
    choice = choice or choose(spec, auto_export=False)
    try:
        cls = backend_class(choice.backend)
    except ImportError as exc:
        raise MissingDependency(f"backend {choice.backend!r} could not be imported ({exc})") from exc
    return cls.from_spec(spec, artifact=choice.artifact)


def load_candidate(spec: ModelSpec, candidate, head: str, threads: int) -> Backend:
    """A backend of ``candidate`` (a ``core.backends.precision.Candidate``: backend, dtype, graph) loaded on
    the spec's device, for measuring it."""
    choice = Choice(candidate.backend, "measuring", artifact=candidate.onnx_file)
    backend = create_backend(spec.model_copy(update={"dtype": candidate.dtype}), choice)
    backend.load(spec.path, head=head, device=spec.device, dtype=candidate.dtype, threads=threads)
    return backend
