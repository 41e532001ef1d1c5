"""ONNX Runtime backend. Imports no torch, so it serves in the Lambda image."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import ClassVar, Mapping

import numpy as np

from core.backends.base import Backend
from core.backends.heads import get_head
from core.config import ModelSpec
from core.errors import BackendFailure, InvalidInput, OutOfMemory, require



ONNX_DTYPES = frozenset({"float32", "fp32", "int8", "float16", "fp16"})

#: execution providers a device name maps to, most preferred first (CPU is always the fallback)
DEVICE_PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def _providers(ort, device: str, requested: list[str] | None = None) -> list:
    """The providers a session gets: ``requested`` (spec ``providers``, e.g. TensorRT first) or the device's.
    Each must be in this onnxruntime build; CUDA/TensorRT come with ``onnxruntime-gpu``."""
    available = ort.get_available_providers()
    kind, _, index = device.partition(":")
    if requested is None:
        if kind not in DEVICE_PROVIDERS:
            raise InvalidInput(f"onnx backend: unknown device {device!r}; use cpu or cuda[:N]")
        requested = DEVICE_PROVIDERS[kind]
    missing = [p for p in requested if p not in available]
    if missing:
        raise InvalidInput(
            f"onnx backend: execution providers {missing} are not in this onnxruntime (available: {available}); "
            "CUDA/TensorRT need `pip install onnxruntime-gpu` (instead of onnxruntime) and a GPU"
        )
    if kind == "cuda" and index:  # pin GPU providers to the device index
        return [(p, {"device_id": int(index)}) if p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
                else p for p in requested]
    return list(requested)


class OnnxBackend(Backend):
    name: ClassVar[str] = "onnx"
    max_batch_size: int | None = None

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> "OnnxBackend":
        from core.backends.registry import onnx_file_for

        return cls(onnx_file=onnx_file_for(spec), providers=spec.providers, spin=spec.ort_spin, lanes=spec.workers,
                   optimized=spec.ort_optimized)

    def __init__(self, onnx_file: Path | None = None, providers: list[str] | None = None, spin: bool = True,
                 lanes: int | None = None, optimized: bool = False) -> None:
        self._onnx_file = onnx_file
        self._optimized = optimized
        self._requested = providers
        self._spin = spin
        self.lanes = lanes
        self._runtime_error: type[Exception] = RuntimeError
        self._session = None
        self._shared = None  # the session runs use while another run is in flight (lanes > 1)
        self._in_flight = 0
        self._lock = threading.Lock()
        self._inputs: frozenset[str] = frozenset()
        self._outputs: list[str] = []
        self._device = "cpu"
        self._dtype = "float32"

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        ort = require("onnxruntime", "onnx")
        from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

        self._runtime_error = RuntimeException
        if dtype not in ONNX_DTYPES:
            raise InvalidInput(f"onnx backend: dtype {dtype!r} not supported; use one of {sorted(ONNX_DTYPES)}")
        path = self._onnx_file
        if path is None:  # the folder's graph of this precision, never one of another
            from core.backends.registry import missing_graph_message, onnx_file_for

            spec = ModelSpec(path=Path(model_dir), dtype=dtype)
            path = onnx_file_for(spec)
            if path is None:
                raise InvalidInput(missing_graph_message(spec))
        if not Path(path).exists():
            raise InvalidInput(
                f"no ONNX graph at {path}: export one with `python scripts/export_onnx.py {model_dir} OUT`"
            )
        providers = _providers(ort, device, self._requested)
        self._session = self._new_session(ort, path, providers, threads)
        if self.lanes is None:  # auto: overlap batches where there are cores to overlap on
            self.lanes = 2 if device == "cpu" and threads >= 2 else 1
        if self.lanes > 1:
            # Batches that overlap each run on threads/lanes threads of their own: no intra-op barrier
            # shared with a thread the OS has lent to HTTP or tokenization, no pool spinning between them.
            # A batch that runs alone (light load) keeps every thread, so single-request latency is not paid.
            self._shared = self._new_session(ort, path, providers, max(1, threads // self.lanes))
        self._inputs = frozenset(i.name for i in self._session.get_inputs())
        outputs = [o.name for o in self._session.get_outputs()]
        wanted = list(get_head(head).outputs)
        missing = [w for w in wanted if w not in outputs]
        if missing:
            raise InvalidInput(f"{path}: ONNX graph lacks outputs {missing} for head {head!r} (has {outputs})")
        self._outputs, self._device, self._dtype = wanted, device, dtype
        self._onnx_file = Path(path)

    def _new_session(self, ort, path: Path, providers: list, threads: int):
        opts = ort.SessionOptions()
        # a graph written by core.convert.ort_optimized is optimized already: loading it skips that work
        opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL if self._optimized
                                         else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # busy-waiting between ops/runs (ONNX Runtime's default) lowers a small request's latency;
        # ort_spin: false gives that CPU to tokenization and the event loop instead
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if self._spin else "0")
        return ort.InferenceSession(str(path), sess_options=opts, providers=providers)

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if self._session is None:
            raise BackendFailure("onnx backend used before load()")
        feeds = {k: v for k, v in inputs.items() if k in self._inputs}
        with self._lock:
            session = self._session if self._in_flight == 0 or self._shared is None else self._shared
            self._in_flight += 1
        try:
            results = session.run(self._outputs, feeds)
        except self._runtime_error as exc:  # an allocation failure is retried in halves by the engine
            if "alloc" in str(exc).lower():
                raise OutOfMemory(f"onnxruntime: {exc}") from exc
            raise
        finally:
            with self._lock:
                self._in_flight -= 1
        return {name: out if out.dtype == np.float32 else out.astype(np.float32)
                for name, out in zip(self._outputs, results)}

    @property
    def served_file(self) -> Path | None:
        """The graph this backend runs (part of the model's identity in the embedding cache, core/cache)."""
        return self._onnx_file

    def describe(self) -> dict:
        return {"backend": self.name, "device": self._device, "dtype": self._dtype,
                "file": self._onnx_file.name if self._onnx_file else None, "lanes": self.lanes,
                "providers": self._session.get_providers() if self._session is not None else None}
