"""PyTorch backend (transformers ``AutoModel*``): CPU, CUDA, float32/float16/bfloat16."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Mapping

import numpy as np

from core.backends.heads import Head, get_head
from core.config import ModelSpec
from core.errors import BackendFailure, InvalidInput, require

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}


class TorchBackend:
    name: ClassVar[str] = "torch"
    max_batch_size: int | None = None

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> "TorchBackend":
        return cls()

    def __init__(self) -> None:
        self._model = None
        self._device = "cpu"
        self._dtype = "float32"
        self._head: Head | None = None
        self._accepts: frozenset[str] = frozenset()

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        torch = require("torch", "torch")
        transformers = require("transformers", "torch")
        if dtype not in _DTYPES:
            raise InvalidInput(f"torch backend: dtype {dtype!r} not supported; use one of {sorted(_DTYPES)}")
        spec = get_head(head)
        self._dtype = _DTYPES[dtype]
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InvalidInput(f"device {device!r} requested but CUDA is not available to torch")
        if self._dtype != "float32" and device == "cpu" and self._dtype == "float16":
            raise InvalidInput("float16 on CPU is not supported by the torch backend; use float32 or bfloat16")
        torch.set_num_threads(threads)
        auto = getattr(transformers, spec.auto_class)
        model = auto.from_pretrained(str(model_dir), dtype=getattr(torch, self._dtype))
        model.eval()
        self._model = model.to(device)
        self._device, self._head = device, spec
        import inspect

        self._accepts = frozenset(spec.inputs or inspect.signature(model.forward).parameters)

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        import torch

        if self._model is None:
            raise BackendFailure("torch backend used before load()")
        feeds = {k: torch.from_numpy(v).to(self._device) for k, v in inputs.items() if k in self._accepts}
        with torch.inference_mode():
            out = self._head.call(self._model, feeds)
        return {k: v.float().cpu().numpy() for k, v in out.items()}

    def health(self) -> None:
        if self._model is None:
            raise BackendFailure("torch model not loaded")

    def describe(self) -> dict:
        return {"backend": self.name, "device": self._device, "dtype": self._dtype}
