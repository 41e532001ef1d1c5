"""Reading a model folder: what it is (task), how its sentence-transformers modules pool and
normalize, its max length, and its tokenizer. Pure file reading: no framework import."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InvalidInput


@dataclass(frozen=True)
class ModelInfo:
    folder: Path
    config: dict[str, Any]
    architectures: tuple[str, ...]
    pooling: str = "mean"
    normalize: bool = False
    max_length: int = 512
    dimension: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    #: Pooling's include_prompt (sentence-transformers): false leaves prompt tokens out of pooling
    include_prompt: bool = True

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def _pooling_mode(cfg: dict[str, Any]) -> str:
    if "pooling_mode" in cfg:  # newer sentence-transformers write the mode by name
        mode = str(cfg["pooling_mode"])
        return "lasttoken" if mode in ("lasttoken", "last_token") else mode
    for key, mode in (
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_lasttoken", "lasttoken"),
        ("pooling_mode_max_tokens", "max"),
        ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
        ("pooling_mode_mean_tokens", "mean"),
    ):
        if cfg.get(key):
            return mode
    return "mean"


def read_model_info(folder: Path, *, max_length: int | None = None) -> ModelInfo:
    """Inspect ``folder``; raise ``InvalidInput`` when it is not a model folder."""
    folder = Path(folder)
    config = _read_json(folder / "config.json")
    if not config:
        raise InvalidInput(f"{folder} has no config.json: not a model folder")
    pooling, normalize = "cls", False
    include_prompt = True
    modules = json.loads((folder / "modules.json").read_text()) if (folder / "modules.json").exists() else []
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Pooling"):
            pooling_cfg = _read_json(folder / module.get("path", "") / "config.json")
            pooling = _pooling_mode(pooling_cfg)
            include_prompt = bool(pooling_cfg.get("include_prompt", True))
        elif kind.endswith("Normalize"):
            normalize = True
    if not modules:  # a plain transformers encoder: mean pooling is the common choice for embeddings
        pooling = "mean"
    st_cfg = _read_json(folder / "sentence_bert_config.json")
    tok_cfg = _read_json(folder / "tokenizer_config.json")
    positions = config.get("max_position_embeddings") or 10**6
    tok_limit = tok_cfg.get("model_max_length") or 10**6
    limit = min(int(positions), int(max_length or st_cfg.get("max_seq_length") or min(tok_limit, positions)))
    st_model_cfg = _read_json(folder / "config_sentence_transformers.json")
    return ModelInfo(
        folder=folder,
        config=config,
        architectures=tuple(config.get("architectures") or ()),
        pooling=pooling,
        normalize=normalize,
        max_length=limit,
        dimension=config.get("hidden_size") or config.get("d_model"),
        prompts=dict(st_model_cfg.get("prompts") or {}),
        default_prompt_name=st_model_cfg.get("default_prompt_name"),
        include_prompt=include_prompt,
    )


#: architectures (config.json) served by a multi-modal task; anything else is a text encoder
MULTIMODAL_ARCHITECTURES = {
    "CLIPModel": "clip",
    "SiglipModel": "clip",
    "ClapModel": "clap",
    "ColPaliForRetrieval": "colpali",
}


def num_labels(config: dict[str, Any]) -> int:
    """Labels of a sequence-classification config (transformers derives num_labels from id2label)."""
    if config.get("id2label"):
        return len(config["id2label"])
    return int(config.get("num_labels", 2))


def is_late_interaction(folder: Path) -> bool:
    """A ColBERT-style folder: PyLate / sentence-transformers layout whose config_sentence_transformers.json
    names a ColBERT model or carries query/document lengths (see docs/text-tasks.md)."""
    st_cfg = _read_json(Path(folder) / "config_sentence_transformers.json")
    return st_cfg.get("model_type") == "ColBERT" or ("query_length" in st_cfg and "document_length" in st_cfg)


def detect_task(info: ModelInfo) -> str:
    """The task a folder serves when its spec says ``task: auto`` (read from config.json, as Infinity does):
    ``*ForSequenceClassification`` with one label (or a sentence-transformers CrossEncoder) → rerank, with
    more labels → classify; ``*ForMaskedLM`` without a pooling module → sparse (SPLADE); a ColBERT folder
    → late_interaction; CLIP/SigLIP/CLAP/ColPali architectures → their multi-modal task; anything else → embed."""
    for arch in info.architectures:
        if arch in MULTIMODAL_ARCHITECTURES:
            return MULTIMODAL_ARCHITECTURES[arch]
    if is_late_interaction(info.folder):
        return "late_interaction"
    if any(a.endswith("ForSequenceClassification") for a in info.architectures):
        return "rerank" if num_labels(info.config) == 1 else "classify"
    st_cfg = _read_json(info.folder / "config_sentence_transformers.json")
    if st_cfg.get("model_type") == "CrossEncoder":
        return "rerank" if num_labels(info.config) == 1 else "classify"
    if st_cfg.get("model_type") == "SparseEncoder":
        return "sparse"
    if any(a.endswith("ForMaskedLM") for a in info.architectures):
        modules = _read_json(info.folder / "modules.json") if (info.folder / "modules.json").exists() else []
        if not any(str(m.get("type", "")).endswith("Pooling") for m in modules):
            return "sparse"
    return "embed"
