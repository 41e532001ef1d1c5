"""``backend: auto`` on an accelerator: the fastest *verified* configuration among candidates.

On CUDA, with no dtype in the spec, the candidates are torch float16, torch bfloat16 and, where
onnxruntime has the CUDA provider (``onnxruntime-gpu``), ONNX Runtime on the fp16 graph. Each one is loaded
on the device, run on the export cache's probe batch (``core.export_cache.probe_inputs``) and compared with
torch float32 on the same device: it is kept only if every output's worst cosine reaches
``PARITY_MIN_COSINE`` (0.9999, the rule the CPU export passes) and its worst relative norm error is at most
``HALF_MAX_NORM_ERROR`` (half-precision rounding: float16 keeps ~3 decimal digits, bfloat16 ~2). The kept
ones are timed on a batch of 32 probe rows (median of ``TIMED_RUNS`` runs after ``WARM_RUNS``) and the
fastest serves. When none is kept, torch float32 serves, and the reason says which failed and how.

The measurement is stored in the cache (``<cache_dir>/choices/<key>.json``; the key covers the model's
files, the head, the device's name and the installed runtime versions), so later starts on the same kind
of GPU reuse it and measure nothing.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from core.backends.base import Backend
from core.errors import TesseraError

if TYPE_CHECKING:  # annotations only: the spec's module imports the backends' catalog
    from core.config import ModelSpec

log = logging.getLogger(__name__)

HALF_MAX_NORM_ERROR = 1e-2
WARM_RUNS = 3
TIMED_RUNS = 10
#: rows of the timed batch (the probe texts repeated), the batch size a busy server forms
TIMED_ROWS = 32
#: bumped when the way candidates are measured changes (stored choices of an older method are ignored)
METHOD_VERSION = 1


@dataclass(frozen=True)
class Candidate:
    backend: str
    dtype: str
    onnx_file: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.backend}:{self.dtype}"


#: loads a candidate on the spec's device (the registry builds it: ``core.backends.registry.load_candidate``)
Loader = Callable[[Candidate], Backend]


@dataclass(frozen=True)
class Verdict:
    """What serves, and why (the registry turns it into its ``Choice``)."""

    backend: str
    dtype: str
    reason: str
    onnx_file: Path | None = None
    fell_back: bool = False


@dataclass
class Measured:
    label: str
    backend: str
    dtype: str
    onnx_file: str | None
    kept: bool
    worst_cosine: float | None = None
    worst_norm_error: float | None = None
    ms: float | None = None
    why: str = ""


def cuda_candidates(spec: ModelSpec, head: str, cache_dir: Path, auto_export: bool) -> tuple[list[Candidate], list[str]]:
    """The candidates on CUDA, and why any usual one is absent (shown in the reason)."""
    out = [Candidate("torch", "float16"), Candidate("torch", "bfloat16")]
    notes = []
    try:
        import onnxruntime
    except ImportError:
        return out, ["ONNX Runtime not installed"]
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return out, ["onnxruntime has no CUDA provider (pip install onnxruntime-gpu)"]
    if not auto_export:
        return out, ["ONNX Runtime CUDA not tried: auto_export is off"]
    from core.convert.export_cache import ExportUnavailable, cached_fp16

    try:
        out.append(Candidate("onnx", "float16", onnx_file=cached_fp16(spec.path, head=head, cache_dir=cache_dir,
                                                                       max_length=spec.max_length,
                                                                       name=spec.served_name)))
    except ExportUnavailable as exc:
        notes.append(f"ONNX Runtime CUDA not tried: {exc}")
    return out, notes


def device_name(device: str) -> str:
    """What the stored choice is keyed by: the GPU's model name (``torch.cuda.get_device_name``), or the CPU."""
    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        return torch.cuda.get_device_name(index)
    import platform

    return f"cpu-{platform.machine()}"


def _release(backend) -> None:
    del backend
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _time(backend, feeds: dict[str, np.ndarray]) -> float:
    batch = {k: np.concatenate([v] * -(-TIMED_ROWS // len(v)))[:TIMED_ROWS] for k, v in feeds.items()}
    for _ in range(WARM_RUNS):
        backend.run(batch)
    times = []
    for _ in range(TIMED_RUNS):  # run() returns host arrays: each call has finished on the device
        started = time.perf_counter()
        backend.run(batch)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(spec: ModelSpec, head: str, candidates: list[Candidate], load: Loader) -> list[Measured]:
    """Each candidate's parity against torch float32 on the spec's device, and the time of the kept ones."""
    from core.convert.export_cache import PARITY_MIN_COSINE, compare, probe_inputs

    feeds = probe_inputs(spec.path, head, spec.max_length)
    reference = load(Candidate("torch", "float32"))
    want = {k: np.asarray(v) for k, v in reference.run(feeds).items()}
    _release(reference)
    results = []
    for candidate in candidates:
        m = Measured(candidate.label, candidate.backend, candidate.dtype,
                     str(candidate.onnx_file) if candidate.onnx_file else None, kept=False)
        try:
            backend = load(candidate)
            cosines, norm_errors = compare(backend.run(feeds), want, feeds["attention_mask"])
            m.worst_cosine, m.worst_norm_error = min(cosines.values()), max(norm_errors.values())
            if m.worst_cosine < PARITY_MIN_COSINE or m.worst_norm_error > HALF_MAX_NORM_ERROR:
                m.why = (f"parity: worst cosine {m.worst_cosine:.6f} (needs {PARITY_MIN_COSINE}), "
                         f"norm error {m.worst_norm_error:.1e} (at most {HALF_MAX_NORM_ERROR:.0e})")
            else:
                m.kept, m.ms = True, _time(backend, feeds)
            _release(backend)
        except (TesseraError, RuntimeError, ValueError, OSError, ImportError) as exc:
            m.why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log.info("model %s: %s on %s: %s", spec.served_name, m.label, spec.device,
                 f"worst cosine {m.worst_cosine:.6f}, {m.ms:.2f} ms per batch of {TIMED_ROWS}" if m.kept else m.why)
        results.append(m)
    return results


def _stored(path: Path) -> list[Measured] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("method") != METHOD_VERSION:
        return None
    return [Measured(**row) for row in data["measured"]]


def fastest(spec: ModelSpec, head: str, candidates: list[Candidate], *, load: Loader, cache_dir: Path,
            notes: list[str] | None = None) -> Verdict:
    """The fastest candidate that keeps parity (measured now, or read from the cache); torch float32 when
    none does."""
    from core.convert.export_cache import cache_key, write_json

    name = device_name(spec.device)
    key, inputs = cache_key(spec.path, head=head, cache_dir=cache_dir, dtype=f"fastest@{name}")
    labels = sorted(c.label for c in candidates)
    stored_file = Path(cache_dir) / "choices" / f"{key}-{'+'.join(labels).replace(':', '-')}.json"
    measured = _stored(stored_file)
    how = "measured at an earlier start"
    if measured is None:
        started = time.monotonic()
        log.info("model %s: choosing the fastest verified configuration on %s (%s); kept for later starts",
                 spec.served_name, name, ", ".join(c.label for c in candidates))
        measured = measure(spec, head, candidates, load)
        how = f"measured now in {time.monotonic() - started:.1f}s"
        try:
            write_json(stored_file, {**inputs, "method": METHOD_VERSION, "device_name": name,
                                     "measured": [asdict(m) for m in measured], "created": time.time()})
        except OSError as exc:  # a read-only cache still serves; the next start measures again
            log.warning("could not keep the measurement in %s: %s", stored_file, exc)
    table = "; ".join(f"{m.label} {m.ms:.2f} ms" if m.kept else f"{m.label} refused ({m.why})" for m in measured)
    extra = "".join(f"; {n}" for n in notes or ())
    kept = [m for m in measured if m.kept]
    if not kept:
        return Verdict("torch", "float32", f"on {name} no half-precision configuration kept parity with float32 "
                                           f"({table}{extra}); torch float32", fell_back=True)
    best = min(kept, key=lambda m: m.ms)
    return Verdict(best.backend, best.dtype, f"fastest verified on {name}, {how}: {table} (batch of {TIMED_ROWS}){extra}",
                   onnx_file=Path(best.onnx_file) if best.onnx_file else None)
