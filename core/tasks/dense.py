"""sentence-transformers ``Dense`` modules in numpy, run by the embed task on the pooled vector. (In this code
"dense" names these modules only, as ``dense_path`` does; a text's one vector is "pooled", as opposed to
"sparse" and to every token's, "tokens": ``EmbedRequest.output``.)

Why here and not in the backend graph: the projection is one small matmul per item on a (batch, hidden)
array, microseconds beside the encoder; running it in the task keeps every backend (torch, ONNX, CTranslate2,
Neuron) serving the same ``encoder`` head and the same graph, int8/fp16 graphs included, and gives the same
numbers on each. Weights come from the module folder's ``model.safetensors`` (no framework needed) or
``pytorch_model.bin`` (read with torch; the ONNX/CTranslate2 converters write ``model.safetensors``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from core.errors import InvalidInput, MissingDependency, Unsupported
from core.loading import DenseModule


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf

        return erf(x).astype(x.dtype, copy=False)
    except ImportError:  # exact erf without scipy (a few thousand values per batch at most)
        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype, copy=False)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (0.5 * (1.0 + np.tanh(0.5 * x))).astype(x.dtype, copy=False)


#: torch.nn activation class names (with their default arguments, as sentence-transformers re-creates them)
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Identity": lambda x: x,
    "Tanh": np.tanh,
    "ReLU": lambda x: np.maximum(x, 0),
    "Sigmoid": _sigmoid,
    "GELU": lambda x: (0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))).astype(x.dtype, copy=False),
    "SiLU": lambda x: x * _sigmoid(x),
    "LeakyReLU": lambda x: np.where(x >= 0, x, np.float32(0.01) * x),
    "ELU": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    "Softplus": lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))),  # torch's threshold=20
    "Softsign": lambda x: x / (1 + np.abs(x)),
    "Hardtanh": lambda x: np.clip(x, -1, 1),
}


def activation_for(path: str, where: Path) -> Callable[[np.ndarray], np.ndarray]:
    module, _, name = path.rpartition(".")
    if not module.startswith("torch.nn") or name not in ACTIVATIONS:
        raise Unsupported(f"{where}: Dense activation {path!r} is not implemented; supported: "
                          f"torch.nn {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    try:
        from safetensors.numpy import load_file
    except ImportError as exc:
        raise MissingDependency(f"{path} needs the safetensors package: pip install -e '.[onnx]' (or '.[torch]')") from exc
    return load_file(str(path))


def load_torch_state(path: Path, *, written_by: str) -> dict[str, np.ndarray]:
    """A torch state dict file as float32 arrays, read on the torch thread (``core/torch_thread.py``: the
    process keeps one OpenMP team). ``written_by``: the converters' safetensors file that replaces it, named
    when torch is not installed."""
    try:
        import torch
    except ImportError as exc:
        raise MissingDependency(
            f"{path} needs torch to read (pip install -e '.[torch]'), or convert the folder with "
            f"scripts/export_onnx.py / scripts/convert_ct2.py, which write {written_by}"
        ) from exc
    from core.torch_thread import on_torch_thread

    def read() -> dict[str, np.ndarray]:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}

    return on_torch_thread(read)


def _read_weights(folder: Path) -> dict[str, np.ndarray]:
    if (folder / "model.safetensors").exists():
        return load_safetensors(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").exists():
        return load_torch_state(folder / "pytorch_model.bin", written_by="model.safetensors")
    raise InvalidInput(f"{folder}: Dense module without weights (model.safetensors or pytorch_model.bin)")


@dataclass(frozen=True, slots=True)
class DenseLayer:
    weight: np.ndarray  # (out, in) float32
    bias: np.ndarray | None
    activation: Callable[[np.ndarray], np.ndarray]
    residual: np.ndarray | None  # (out, in) projection of the residual; None: identity residual
    use_residual: bool

    @classmethod
    def load(cls, module: DenseModule) -> "DenseLayer":
        tensors = _read_weights(module.folder)
        if "linear.weight" not in tensors:
            raise InvalidInput(f"{module.folder}: no 'linear.weight' tensor (has {sorted(tensors)})")
        weight = np.ascontiguousarray(tensors["linear.weight"], dtype=np.float32)
        if weight.shape != (module.out_features, module.in_features):
            raise InvalidInput(f"{module.folder}: linear.weight is {weight.shape}, config says "
                               f"({module.out_features}, {module.in_features})")
        bias = tensors.get("linear.bias") if module.bias else None
        if module.bias and bias is None:
            raise InvalidInput(f"{module.folder}: config has bias=true but there is no 'linear.bias' tensor")
        residual = None
        if module.use_residual and module.in_features != module.out_features:
            if "residual.weight" not in tensors:
                raise InvalidInput(f"{module.folder}: use_residual needs a 'residual.weight' tensor")
            residual = np.ascontiguousarray(tensors["residual.weight"], dtype=np.float32)
        return cls(weight, None if bias is None else bias.astype(np.float32), activation_for(module.activation,
                   module.folder), residual, module.use_residual)

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight.T
        if self.bias is not None:
            y += self.bias
        y = self.activation(y)
        if self.use_residual:
            y = y + (x if self.residual is None else x @ self.residual.T)
        return y.astype(np.float32, copy=False)
