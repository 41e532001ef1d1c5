"""CTranslate2 backend (``ctranslate2.Encoder``): BERT-family encoders converted by
``scripts/convert_ct2.py`` into ``<folder>/ct2/``. No torch at serving time.

dtype → compute type: float32, int8, int8_float32 on CPU; float16, bfloat16, int8_float16 (and float32,
int8) on CUDA. Weights are converted once as float32; CTranslate2 quantizes them when it loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Collection, Mapping

import numpy as np

from core.backends.base import Backend, BackendOptions, Folder
from core.errors import BackendFailure, InvalidInput, Unsupported, require

if TYPE_CHECKING:
    from core.config import ModelSpec

CT2_SUBDIR = "ct2"

#: transformers config classes whose encoder CTranslate2 converts (CTranslate2 4.x; text encoders only)
SUPPORTED_CONFIGS: dict[str, str] = {
    "bert": "BertConfig",
    "distilbert": "DistilBertConfig",
    "roberta": "RobertaConfig",
    "xlm-roberta": "XLMRobertaConfig",
}

#: spec dtype → CTranslate2 compute type, per device kind
COMPUTE_TYPES: dict[str, dict[str, str]] = {
    "cpu": {"float32": "float32", "int8": "int8", "int8_float32": "int8_float32"},
    "cuda": {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "int8": "int8",
             "int8_float16": "int8_float16", "int8_float32": "int8_float32"},
}


def ct2_dir(model_dir: Path) -> Path | None:
    """Where a folder keeps its converted encoder: ``<folder>/ct2/`` or the folder itself."""
    for candidate in (Path(model_dir) / CT2_SUBDIR, Path(model_dir)):
        if (candidate / "model.bin").exists():
            return candidate
    return None


def check_architecture(config: dict, folder: Path) -> None:
    """Raise ``Unsupported`` naming the supported architectures when CTranslate2 cannot take the model
    (the converter checks before converting, the backend when a folder has no converted encoder)."""
    model_type = str(config.get("model_type", ""))
    if model_type not in SUPPORTED_CONFIGS:
        archs = ", ".join(f"{k} ({v})" for k, v in SUPPORTED_CONFIGS.items())
        raise Unsupported(
            f"{folder}: CTranslate2 has no encoder conversion for model_type {model_type!r} "
            f"(architectures {config.get('architectures')}); supported: {archs}. "
            "Serve this model with backend 'torch' or 'onnx'.",
            code="unsupported_architecture",
        )


def compute_type_for(device: str, dtype: str) -> str:
    kind = "cuda" if device.startswith("cuda") else device
    if kind not in COMPUTE_TYPES:
        raise InvalidInput(f"ct2 backend: unknown device {device!r}; use cpu or cuda[:N]")
    table = COMPUTE_TYPES[kind]
    if dtype not in table:
        hint = " (float16/bfloat16 need a CUDA device)" if kind == "cpu" and dtype in ("float16", "bfloat16",
                                                                                      "int8_float16") else ""
        raise InvalidInput(f"ct2 backend on {kind}: dtype {dtype!r} not supported{hint}; use one of {sorted(table)}")
    return table[dtype]


class CT2Backend(Backend):
    name: ClassVar[str] = "ct2"
    extra: ClassVar[str] = "ct2"
    runtime: ClassVar[str | None] = "ctranslate2"
    auto_order: ClassVar[int | None] = 20
    artifact_label: ClassVar[str] = "CTranslate2 model"
    own_code_converter: ClassVar[str | None] = "scripts/convert_ct2.py"
    #: ``forward_batch`` takes sequence lengths, not a mask
    masks_attention: ClassVar[bool] = False
    max_batch_size: int | None = None

    @classmethod
    def files(cls, listing: Collection[str], *, dtype: str, options: BackendOptions | None) -> list[str]:
        """The converted encoder's folder, ``ct2/`` (``model.bin`` first), whatever the dtype: CTranslate2
        quantizes when it loads."""
        main = f"{CT2_SUBDIR}/model.bin"
        if main not in listing:
            return []
        return [main, *sorted(f for f in listing if f.startswith(CT2_SUBDIR + "/") and f != main)]

    @classmethod
    def missing_files(cls, where: str, *, dtype: str, options: BackendOptions | None) -> str:
        return f"{where} has no {CT2_SUBDIR}/ folder for the ct2 backend"

    @classmethod
    def can_serve(cls, spec: "ModelSpec", folder: Folder) -> str | None:
        """The folder's CTranslate2 model where its runtime is installed; without it (e.g. the SageMaker images)
        the folder's torch weights serve, and a folder with nothing else fails here, naming the extra. A model
        with its own code: only a model converted from that code, with the runtime installed."""
        model = cls.artifact(folder.path, dtype=spec.dtype, options=None, listing=folder.files)
        if model is None:
            return None
        if folder.own_code is not None:
            if not (cls.converted_from_own_code(spec, model) and cls.installed()):
                return None
            return (f"the model runs its own code ({folder.own_code}) and the folder's CTranslate2 model matched it "
                    "(parity.json)")
        if cls.installed() or not folder.has_fallback_weights:
            return "the folder holds a CTranslate2 model (ct2/model.bin)"
        return None

    @classmethod
    def from_spec(cls, spec: "ModelSpec", artifact: Path | None = None) -> "CT2Backend":
        return cls()

    def __init__(self) -> None:
        self._encoder = None
        self._device = "cpu"
        self._dtype = "float32"
        self._compute_type = "float32"

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        if head != "encoder":
            raise Unsupported(f"ct2 backend runs encoder heads only, not {head!r}; use backend 'torch' or 'onnx'")
        folder = ct2_dir(model_dir)
        if folder is None:
            import json

            cfg_path = Path(model_dir) / "config.json"
            if cfg_path.exists():  # an unsupported architecture gets that message, not "convert it"
                check_architecture(json.loads(cfg_path.read_text()), Path(model_dir))
            raise InvalidInput(
                f"no CTranslate2 model in {model_dir} (expected ct2/model.bin): convert it with "
                f"`python scripts/convert_ct2.py {model_dir} OUT` and serve OUT"
            )
        ctranslate2 = require("ctranslate2", "ct2")
        compute_type = compute_type_for(device, dtype)
        kind, _, index = device.partition(":")
        if kind == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            raise InvalidInput(f"device {device!r} requested but CTranslate2 sees no CUDA device")
        supported = ctranslate2.get_supported_compute_types(kind)
        if compute_type not in supported:
            raise InvalidInput(f"ct2 backend: compute type {compute_type!r} not supported on this {kind} "
                               f"(supported: {sorted(supported)})")
        self._encoder = ctranslate2.Encoder(
            str(folder), device=kind, device_index=int(index or 0), compute_type=compute_type,
            intra_threads=threads if kind == "cpu" else 0, inter_threads=1,
        )
        self._device, self._dtype, self._compute_type = device, dtype, compute_type

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        import ctranslate2

        if self._encoder is None:
            raise BackendFailure("ct2 backend used before load()")
        ids = np.ascontiguousarray(inputs["input_ids"], dtype=np.int32)
        lengths = np.ascontiguousarray(inputs["attention_mask"].sum(axis=1), dtype=np.int32)
        types = inputs.get("token_type_ids")
        out = self._encoder.forward_batch(
            ctranslate2.StorageView.from_array(ids), ctranslate2.StorageView.from_array(lengths),
            token_type_ids=types.tolist() if types is not None else None,
        )
        hidden = out.last_hidden_state
        if self._device != "cpu":
            hidden = hidden.to_device(ctranslate2.Device.cpu)
        hidden = np.array(hidden)
        return {"last_hidden_state": hidden if hidden.dtype == np.float32 else hidden.astype(np.float32)}

    def describe(self) -> dict:
        return {"backend": self.name, "device": self._device, "dtype": self._dtype,
                "compute_type": self._compute_type}
