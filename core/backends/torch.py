"""PyTorch backend (transformers ``AutoModel*``): CPU, CUDA, float32/float16/bfloat16, int8.

- float16: CUDA only (refused on CPU). bfloat16: CPU and CUDA.
- int8: dynamic quantization (``torch.ao.quantization.quantize_dynamic``: int8 weights per output
  channel, activations quantized per batch) of the attention ``nn.Linear`` layers; the feed-forward
  layers stay fp32, as in the ONNX "accurate" int8 graph (quantizing them too drops MiniLM's worst
  cosine vs fp32 to ≈0.91, see docs/backends.md). CPU only.
- ``torch: {compile: true}`` in the model spec wraps the model in ``torch.compile`` (first batches of each new
  shape are slow while it compiles; ``dynamic=True`` keeps recompiles down).
"""

from __future__ import annotations

import contextlib
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, ClassVar, Collection, Mapping

import numpy as np
from pydantic import Field

from core.backends.base import Backend, BackendOptions
from core.backends.heads import Head, accepted_inputs, get_head, is_feed_forward, load_head_class
from core.errors import BackendFailure, InvalidInput, OutOfMemory, require
from core.torch_thread import on_torch_thread

if TYPE_CHECKING:
    from core.config import ModelSpec

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16", "int8": "int8", "qint8": "int8"}


def quantize_int8(torch, model):
    """Per-channel dynamic int8 of every Linear outside the feed-forward blocks (in place of the model)."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {name: per_channel_dynamic_qconfig for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and not is_feed_forward(name)}
    with warnings.catch_warnings():  # torch.ao eager quantization warns that it is moving to torchao
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, spec, dtype=torch.qint8)


def attention_kernels(torch, device: str):
    """The scaled-dot-product-attention kernels a forward on ``device`` may use (a context manager), or
    None for torch's own choice. On CUDA, cuDNN's attention is left out: torch builds a cuDNN graph for every
    new input shape, which a server meets all the time, while the flash and memory-efficient kernels have no
    per-shape cost (measured in docs/bench/history.md, "What the GPU run showed")."""
    if not device.startswith("cuda"):
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    allowed = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return lambda: sdpa_kernel(allowed)


def check_device(torch, device: str, dtype: str) -> None:
    """The device/dtype rules of this backend, at load and when a loaded model moves."""
    if device == "cpu" and dtype == "float16":
        raise InvalidInput("float16 on CPU is not supported by the torch backend (CUDA only here); "
                           "use float32, bfloat16 or int8")
    if dtype == "int8" and device != "cpu":
        raise InvalidInput(f"int8 (dynamic quantization) runs on CPU only, not on {device!r}; "
                           "use float16/bfloat16 on CUDA")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidInput(f"device {device!r} requested but CUDA is not available to torch")


#: root weight files that are not the model's: BGE-M3-style heads (core/tasks/multi_output.py) and a Stanford
#: ColBERT checkpoint's projection, which every backend's task reads (``core.hub`` fetches them for all)
NOT_THE_MODEL = ("sparse_linear", "colbert_linear", "linear")


class TorchOptions(BackendOptions):
    """``torch:`` in a model spec."""

    compile: bool = Field(default=False, description="run the model through torch.compile")

    flat = {"compile": "compile"}


class TorchBackend(Backend):
    name: ClassVar[str] = "torch"
    extra: ClassVar[str] = "torch"
    runtime: ClassVar[str | None] = "torch"
    Options = TorchOptions
    artifact_label: ClassVar[str] = "torch weights"
    max_batch_size: int | None = None

    @classmethod
    def files(cls, listing: Collection[str], *, dtype: str, options: BackendOptions | None) -> list[str]:
        """Root weights transformers reads: every ``*.safetensors`` (shards and adapters included), else the
        ``*.bin`` checkpoints (never both: the same weights twice)."""
        root = [f for f in listing if "/" not in f and PurePosixPath(f).stem not in NOT_THE_MODEL]
        safetensors = [f for f in root if f.endswith(".safetensors")]
        bins = [f for f in root if f.endswith(".bin") and f != "training_args.bin"]
        return sorted(safetensors or bins)

    @classmethod
    def missing_files(cls, where: str, *, dtype: str, options: BackendOptions | None) -> str:
        return f"{where} has no weights the torch backend reads (model.safetensors or pytorch_model.bin at the top level)"

    @classmethod
    def from_spec(cls, spec: "ModelSpec", artifact: Path | None = None) -> "TorchBackend":
        return cls(compile=spec.torch.compile, trust_remote_code=spec.trust_remote_code)

    def __init__(self, compile: bool = False, trust_remote_code: bool = False) -> None:
        self._compile = compile
        self._trust_remote_code = trust_remote_code
        self._model = None
        self._eager = None
        self._device = "cpu"
        self._dtype = "float32"
        self._head: Head | None = None
        self._accepts: frozenset[str] = frozenset()
        self._attention = None  # attention_kernels(): set per device

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        """On the CPU, on the process's torch thread (``core.torch_thread``: one OpenMP team), as ``run``."""
        if device == "cpu":
            on_torch_thread(self._load, model_dir, head=head, device=device, dtype=dtype, threads=threads)
        else:
            self._load(model_dir, head=head, device=device, dtype=dtype, threads=threads)

    def _load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        torch = require("torch", "torch")
        if dtype not in _DTYPES:
            raise InvalidInput(f"torch backend: dtype {dtype!r} not supported; use one of {sorted(_DTYPES)}")
        spec = get_head(head)
        self._dtype = _DTYPES[dtype]
        check_device(torch, device, self._dtype)
        torch.set_num_threads(threads)
        auto = load_head_class(model_dir, head, "torch")
        load_dtype = torch.float32 if self._dtype == "int8" else getattr(torch, self._dtype)
        model = auto.from_pretrained(str(model_dir), dtype=load_dtype, trust_remote_code=self._trust_remote_code)
        model.eval()
        self._accepts = frozenset(spec.inputs or accepted_inputs(model))
        if self._dtype == "int8":
            model = quantize_int8(torch, model)
        self._eager = model.to(device)
        self._model = torch.compile(self._eager, dynamic=True) if self._compile else self._eager
        self._device, self._head = device, spec
        self._attention = attention_kernels(torch, device)

    @classmethod
    def cpu_stage(cls, dtype: str) -> str | None:
        """float16 runs on CUDA only: staged as float32 on the CPU and cast when it moves."""
        return "float32" if _DTYPES.get(dtype) == "float16" else dtype

    def to_device(self, device: str, dtype: str | None = None) -> None:
        """Move the loaded model (e.g. loaded on the CPU before a memory snapshot) to ``device``, cast to
        ``dtype`` when given, under ``load``'s rules (CUDA present, float16 on CUDA only, int8 on CPU only).
        ``compile: true`` wraps the moved model again (compiled graphs are specialised per device)."""
        torch = require("torch", "torch")
        if self._model is None:
            raise BackendFailure("torch backend moved before load()")
        if dtype is not None and dtype not in _DTYPES:
            raise InvalidInput(f"torch backend: dtype {dtype!r} not supported; use one of {sorted(_DTYPES)}")
        target = _DTYPES[dtype] if dtype is not None else self._dtype
        if target != self._dtype and "int8" in (target, self._dtype):
            raise InvalidInput(f"torch backend: cannot convert a loaded {self._dtype} model to {target}; load it as {target}")
        check_device(torch, device, target)
        if target == "int8":
            model = self._eager.to(device)
        else:
            model = self._eager.to(device=device, dtype=getattr(torch, target))
        self._eager, self._dtype, self._device = model, target, device
        self._attention = attention_kernels(torch, device)
        self._model = torch.compile(model, dynamic=True) if self._compile else model

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if self._model is None:
            raise BackendFailure("torch backend used before load()")
        if self._device == "cpu":
            return on_torch_thread(self._run, inputs)
        return self._run(inputs)

    def _run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        import torch

        feeds = {k: torch.from_numpy(v).to(self._device) for k, v in inputs.items() if k in self._accepts}
        try:
            with torch.inference_mode(), (self._attention() if self._attention else contextlib.nullcontext()):
                out = self._head.call(self._model, feeds)
        except torch.OutOfMemoryError as exc:
            raise OutOfMemory(f"torch: {exc}") from exc
        return {k: v.float().cpu().numpy() for k, v in out.items()}

    def describe(self) -> dict:
        return {"backend": self.name, "device": self._device, "dtype": self._dtype, "compiled": self._compile}
