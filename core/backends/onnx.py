"""ONNX Runtime backend. Imports no torch, so it serves in the Lambda image."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Mapping

import numpy as np

from core.backends.heads import get_head
from core.config import ModelSpec
from core.errors import BackendFailure, InvalidInput, require



def _providers(ort, device: str) -> list[str]:
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        available = ort.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise InvalidInput(
                f"device {device!r}: onnxruntime has no CUDA provider here ({available}); "
                "install onnxruntime-gpu"
            )
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    raise InvalidInput(f"onnx backend: unknown device {device!r}")


class OnnxBackend:
    name: ClassVar[str] = "onnx"
    max_batch_size: int | None = None

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> "OnnxBackend":
        from core.backends.registry import onnx_file_for

        return cls(onnx_file=onnx_file_for(spec), spin=spec.ort_spin)

    def __init__(self, onnx_file: Path | None = None, spin: bool = False) -> None:
        self._onnx_file = onnx_file
        self._spin = spin
        self._session = None
        self._inputs: frozenset[str] = frozenset()
        self._outputs: list[str] = []
        self._device = "cpu"
        self._dtype = "float32"

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        ort = require("onnxruntime", "onnx")
        path = self._onnx_file or Path(model_dir) / "onnx" / "model.onnx"
        if not Path(path).exists():
            raise InvalidInput(
                f"no ONNX graph at {path}: export one with `python scripts/export_onnx.py {model_dir} OUT`"
            )
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # no busy-waiting between runs: on a small machine the spinning threads would take the CPU from
        # tokenization and the event loop (the model spec's ort_spin: true restores the default, for A/B runs)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if self._spin else "0")
        self._session = ort.InferenceSession(str(path), sess_options=opts, providers=_providers(ort, device))
        self._inputs = frozenset(i.name for i in self._session.get_inputs())
        outputs = [o.name for o in self._session.get_outputs()]
        wanted = list(get_head(head).outputs)
        missing = [w for w in wanted if w not in outputs]
        if missing:
            raise InvalidInput(f"{path}: ONNX graph lacks outputs {missing} for head {head!r} (has {outputs})")
        self._outputs, self._device, self._dtype = wanted, device, dtype
        self._onnx_file = Path(path)

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if self._session is None:
            raise BackendFailure("onnx backend used before load()")
        feeds = {k: v for k, v in inputs.items() if k in self._inputs}
        results = self._session.run(self._outputs, feeds)
        return {name: out if out.dtype == np.float32 else out.astype(np.float32)
                for name, out in zip(self._outputs, results)}

    def health(self) -> None:
        if self._session is None:
            raise BackendFailure("onnx session not loaded")

    def describe(self) -> dict:
        return {"backend": self.name, "device": self._device, "dtype": self._dtype,
                "file": self._onnx_file.name if self._onnx_file else None}
