"""Reading a model folder: what it is (task), how its sentence-transformers modules pool and
normalize, its max length, its tokenizer, and whether a converted artifact came from the model's own
code. Pure file reading: no framework import. (The files each backend reads are its own declaration:
``Backend.files`` in ``core/backends/``.)"""

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


#: sentence-transformers' Pooling modes, in the order it concatenates legacy ``pooling_mode_*`` flags
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_POOLING_ALIASES = {"last_token": "lasttoken", "last-token": "lasttoken", "mean-sqrt-len": "mean_sqrt_len_tokens",
                    "mean_sqrt_len": "mean_sqrt_len_tokens", "weighted_mean": "weightedmean",
                    "weighted-mean": "weightedmean"}
_LEGACY_POOLING_KEYS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)


def parse_pooling(value: Any, *, where: str = "pooling") -> str:
    """A pooling mode by name (TEI spellings such as ``last-token`` accepted), or several joined by ``+``
    (``mean+max``: concatenated, as sentence-transformers does for a tuple of modes). Unknown → InvalidInput."""
    parts = list(value) if isinstance(value, (list, tuple)) else str(value).split("+")
    modes = []
    for part in parts:
        mode = _POOLING_ALIASES.get(str(part).strip().lower(), str(part).strip().lower())
        if mode not in POOLING_MODES:
            raise InvalidInput(f"{where}: unknown pooling mode {part!r}; known: {list(POOLING_MODES)}")
        modes.append(mode)
    if not modes:
        raise InvalidInput(f"{where}: no pooling mode given; known: {list(POOLING_MODES)}")
    return "+".join(modes)


def _pooling_mode(cfg: dict[str, Any]) -> str:
    if "pooling_mode" in cfg:  # newer sentence-transformers write the mode (or a list of modes) by name
        return parse_pooling(cfg["pooling_mode"], where="Pooling config")
    modes = [mode for key, mode in _LEGACY_POOLING_KEYS if cfg.get(key)]
    return "+".join(modes) or "mean"


#: model types whose position ids start at pad_token_id + 1 (RoBERTa's scheme): that many fewer tokens fit
OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert", "longformer"})


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
    if config.get("model_type") in OFFSET_POSITIONS:  # positions start after the padding index
        positions -= int(config.get("pad_token_id") or 1) + 1
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


#: vision–language embedders of the Qwen2-VL layout (GME, Qwen3-VL-Embedding): served by the vlm_embed task
VLM_EMBED_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl"})

#: architectures (config.json) served by a multi-modal task; anything else is a text encoder
MULTIMODAL_ARCHITECTURES = {
    "CLIPModel": "clip",
    "SiglipModel": "clip",
    "Siglip2Model": "clip",
    "ClapModel": "clap",
    "ColPaliForRetrieval": "colpali",
}


def num_labels(config: dict[str, Any]) -> int:
    """Labels of a sequence-classification config (transformers derives num_labels from id2label)."""
    if config.get("id2label"):
        return len(config["id2label"])
    return int(config.get("num_labels", 2))


def labels_of(config: dict[str, Any]) -> list[str]:
    """A sequence-classification config's labels by index (id2label; transformers' LABEL_i where missing)."""
    id2label = config.get("id2label") or {}
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(num_labels(config))]


#: the settings file of a Stanford ColBERT checkpoint (colbert-ir/colbertv2.0, answerai-colbert-small-v1)
STANFORD_COLBERT_METADATA = "artifact.metadata"


def is_stanford_colbert(folder: Path) -> bool:
    """A Stanford ColBERT checkpoint (the ``HF_ColBERT`` layout): ``architectures: ["HF_ColBERT"]``, the encoder's
    weights under ``bert.`` and the projection ``linear.weight`` in the same file, the settings in
    ``artifact.metadata``."""
    config = _read_json(Path(folder) / "config.json")
    return "HF_ColBERT" in (config.get("architectures") or ())


def stanford_colbert_settings(folder: Path) -> dict[str, Any]:
    """A Stanford ColBERT checkpoint's ``artifact.metadata`` as PyLate's settings (the keys of
    ``config_sentence_transformers.json``), with ColBERT's defaults where it says nothing: the [Q]/[D] marker
    tokens ``[unused0]``/``[unused1]`` after [CLS], queries padded with [MASK] to ``query_maxlen`` (attended
    only with ``attend_to_mask_tokens``), documents cut at ``doc_maxlen``, punctuation skipped in documents
    (``mask_punctuation``)."""
    import string

    meta = _read_json(Path(folder) / STANFORD_COLBERT_METADATA)
    return {
        "query_prefix": meta.get("query_token_id", "[unused0]"),
        "document_prefix": meta.get("doc_token_id", "[unused1]"),
        "query_length": int(meta.get("query_maxlen", 32)),
        "document_length": int(meta.get("doc_maxlen", 180)),
        "do_query_expansion": True,
        "attend_to_expansion_tokens": bool(meta.get("attend_to_mask_tokens", False)),
        "skiplist_words": list(string.punctuation) if meta.get("mask_punctuation", True) else [],
    }


def is_late_interaction(folder: Path) -> bool:
    """A ColBERT-style folder: PyLate / sentence-transformers layout whose config_sentence_transformers.json
    names a ColBERT model or carries query/document lengths, or a Stanford ColBERT checkpoint (``HF_ColBERT``;
    see docs/text-tasks.md)."""
    st_cfg = _read_json(Path(folder) / "config_sentence_transformers.json")
    return (st_cfg.get("model_type") == "ColBERT" or ("query_length" in st_cfg and "document_length" in st_cfg)
            or is_stanford_colbert(folder))


def is_multi_output(folder: Path) -> bool:
    """A BGE-M3-style folder: ``sparse_linear`` and ``colbert_linear`` heads (``.pt`` or ``.safetensors``)
    beside the encoder (see core/tasks/multi_output.py)."""
    folder = Path(folder)
    return all((folder / f"{n}.pt").exists() or (folder / f"{n}.safetensors").exists()
               for n in ("sparse_linear", "colbert_linear"))


def is_causal_lm(info: ModelInfo) -> bool:
    return any(a.endswith("ForCausalLM") for a in info.architectures)


def logit_score_config(folder: Path) -> dict[str, Any] | None:
    """The config of a sentence-transformers ``LogitScore`` module (a causal-LM reranker scored by the logits
    of its true/false tokens: ``true_token_id``, ``false_token_id``), or None when modules.json lists none."""
    folder = Path(folder)
    modules = _read_json(folder / "modules.json") if (folder / "modules.json").exists() else []
    for module in modules if isinstance(modules, list) else ():
        if str(module.get("type", "")).rsplit(".", 1)[-1] == "LogitScore":
            return _read_json(folder / str(module.get("path", "")) / "config.json")
    return None


def _names_a_reranker(folder: Path) -> bool:
    """The folder's name says "reranker" (in a Hugging Face cache, the ``models--org--name`` folder above
    ``snapshots/<revision>``)."""
    folder = Path(folder).resolve()
    names = [folder.name]
    if folder.parent.name == "snapshots":
        names.append(folder.parent.parent.name)
    return any("rerank" in name.lower() for name in names)


def is_llm_reranker(info: ModelInfo) -> bool:
    """A causal LM that reranks by the logits of its "yes"/"no" tokens (Qwen3-Reranker layout): its
    modules.json has a sentence-transformers ``LogitScore`` module; or it is a ``*ForCausalLM`` whose
    config_sentence_transformers.json names a CrossEncoder; or a ``*ForCausalLM`` without sentence-transformers
    modules whose folder is named as a reranker (the original Qwen3-Reranker folders carry nothing else that
    tells them from a chat model; any other causal LM reranks with spec ``task: rerank``)."""
    if logit_score_config(info.folder) is not None:
        return True
    if not is_causal_lm(info):
        return False
    if _read_json(info.folder / "config_sentence_transformers.json").get("model_type") == "CrossEncoder":
        return True
    return not (info.folder / "modules.json").exists() and _names_a_reranker(info.folder)


def detect_task(info: ModelInfo) -> str:
    """The task a folder serves when its spec says ``task: auto`` (read from config.json, as Infinity does):
    ``*ForSequenceClassification`` with one label (or a sentence-transformers CrossEncoder) → rerank, with
    more labels → classify; ``*ForMaskedLM`` without a pooling module → sparse (SPLADE); a ColBERT folder
    → late_interaction; ``sparse_linear`` + ``colbert_linear`` heads (BGE-M3) → multi_output;
    CLIP/SigLIP/CLAP/ColPali architectures → their multi-modal task; a Qwen2-VL-layout model (GME) →
    vlm_embed; a causal-LM reranker (``is_llm_reranker``) → llm_rerank; anything else → embed."""
    if info.model_type in VLM_EMBED_TYPES:
        return "vlm_embed"
    for arch in info.architectures:
        if arch in MULTIMODAL_ARCHITECTURES:
            return MULTIMODAL_ARCHITECTURES[arch]
    if is_multi_output(info.folder):
        return "multi_output"
    if is_late_interaction(info.folder):
        return "late_interaction"
    if is_llm_reranker(info):
        return "llm_rerank"
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


# --- models that run their own code (config.json ``auto_map``) ---

#: beside a converted artifact (``onnx/``, ``ct2/``): which code the converter loaded and the artifacts that
#: matched it (worst cosine against the model as that code computes it)
PARITY_RECORD = "parity.json"


def custom_code(config: dict[str, Any]) -> str | None:
    """The model's own code a ``config.json`` names (``auto_map``), e.g. ``AutoModel → modeling_lora.XLMRobertaLoRA``,
    or None for a model transformers' built-in classes run."""
    auto_map = config.get("auto_map") or {}
    if not auto_map:
        return None
    key = "AutoModel" if "AutoModel" in auto_map else next(iter(auto_map))
    target = auto_map[key]
    return f"{key} → {target[0] if isinstance(target, (list, tuple)) else target}"


def task_adapters(config: dict[str, Any]) -> tuple[str, ...]:
    """The task adapters a model's own code selects per input (jina-embeddings-v3: ``lora_adaptations`` in
    config.json, chosen by an ``adapter_mask`` of task indices per row); none for a model without its own code."""
    if not config.get("auto_map"):
        return ()
    return tuple(str(t) for t in config.get("lora_adaptations") or ())


def checked_with_own_code(artifact: Path) -> bool:
    """Whether a converted artifact (``onnx/model.onnx``, ``ct2/model.bin``) was converted from the model's own
    code and matched it: its folder's ``parity.json`` (written by ``scripts/export_onnx.py --trust-remote-code``
    and ``scripts/convert_ct2.py --trust-remote-code``) names that code and the artifact."""
    record = _read_json(Path(artifact).parent / PARITY_RECORD)
    return bool(record.get("own_code")) and Path(artifact).name in (record.get("checked") or {})


# --- sentence-transformers pipelines of embedding models (Transformer → Pooling → Dense… → Normalize) ---

#: the sentence-transformers modules an embedding folder may list (class names; any other is refused)
EMBED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")


@dataclass(frozen=True)
class DenseModule:
    """A sentence-transformers ``Dense`` module: ``activation(x @ W.T + b)`` (``+ x`` or ``+ x @ R.T`` with
    ``use_residual``), read from its folder (``config.json`` and ``model.safetensors``/``pytorch_model.bin``)."""

    folder: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # the class path sentence-transformers saved, e.g. torch.nn.modules.activation.Tanh
    use_residual: bool = False


@dataclass(frozen=True)
class EmbedPipeline:
    #: one mode, or several joined by "+" (their pooled vectors concatenated in that order)
    pooling: str
    include_prompt: bool
    #: what runs on the pooled vector, in module order: ``DenseModule``s and ``"normalize"`` (a Normalize
    #: followed by a Dense); a trailing Normalize is ``normalize`` instead, so a request may turn it off
    steps: tuple[DenseModule | str, ...]
    normalize: bool


def _module_class(kind: str) -> str | None:
    """``sentence_transformers.models.Dense`` (any sentence-transformers version's path) → ``Dense``;
    None for a type from another package (a custom module: never run as if it were a known one)."""
    if kind.split(".")[0] != "sentence_transformers":
        return None
    name = kind.rsplit(".", 1)[-1]
    return name if name in EMBED_MODULES else None


def _with_dense_path(modules: list[dict], dense_path: str, folder: Path) -> list[dict]:
    """``modules`` with its one Dense module read from ``dense_path`` instead (TEI's ``--dense-path``)."""
    from core.errors import Unsupported

    if not (folder / dense_path / "config.json").is_file():
        raise InvalidInput(f"{folder}: dense_path {dense_path!r} has no config.json (a sentence-transformers Dense "
                           "module folder, such as 2_Dense_256)")
    if not modules:
        raise Unsupported(f"{folder}: dense_path needs the folder's modules.json (where the Pooling module and the "
                          "Dense it replaces are listed)")
    dense = [m for m in modules if _module_class(str(m.get("type", ""))) == "Dense"]
    if len(dense) != 1:
        raise Unsupported(f"{folder}: dense_path replaces the one Dense module, and modules.json lists {len(dense)}")
    return [{**m, "path": dense_path} if m is dense[0] else m for m in modules]


def read_embed_pipeline(folder: Path, *, pooling: str | None = None, dense_path: str | None = None) -> EmbedPipeline:
    """The post-encoder pipeline of an embedding folder from its ``modules.json``, or ``Unsupported`` naming
    the first module Tessera does not implement (a different vector is never served silently). ``pooling``
    (the spec's override, as TEI's ``--pooling``) replaces the Pooling module's mode; ``dense_path`` (TEI's
    ``--dense-path``) the folder of the one Dense module."""
    from core.errors import Unsupported

    folder = Path(folder)
    modules_file = folder / "modules.json"
    override = parse_pooling(pooling, where="spec pooling") if pooling is not None else None
    modules = json.loads(modules_file.read_text()) if modules_file.exists() else []
    if dense_path is not None:
        modules = _with_dense_path(modules, dense_path, folder)
    if not modules:  # a plain transformers encoder: mean pooling is the common choice
        return EmbedPipeline(override or "mean", True, (), False)
    modules = sorted(modules, key=lambda m: int(m.get("idx", 0)))
    mode, include_prompt, pooled = "mean", True, False
    steps: list[DenseModule | str] = []
    for position, module in enumerate(modules):
        kind, sub = str(module.get("type", "")), str(module.get("path", ""))
        name = _module_class(kind)
        where = f"{folder}: module {kind!r} ({sub or 'the folder root'})"
        if name is None:
            raise Unsupported(f"{where} is not implemented by Tessera's embed task (it runs the "
                              f"sentence-transformers modules {list(EMBED_MODULES)}); serving without it would "
                              "give different vectors")
        cfg = _read_json(folder / sub / "config.json")
        if name == "Transformer":
            if position != 0 or sub not in ("", "."):
                raise Unsupported(f"{where}: the Transformer must be the first module, saved at the folder root")
            continue
        if name == "Pooling":
            if pooled:
                raise Unsupported(f"{where}: a second Pooling module is not supported")
            mode, include_prompt, pooled = _pooling_mode(cfg), bool(cfg.get("include_prompt", True)), True
            continue
        if not pooled:
            raise Unsupported(f"{where}: a {name} module before Pooling (on token embeddings) is not supported")
        for key in ("module_input_name", "module_output_name"):
            if cfg.get(key) not in (None, "sentence_embedding"):
                raise Unsupported(f"{where}: {key}={cfg[key]!r} is not supported (only 'sentence_embedding')")
        if name == "Normalize":
            steps.append("normalize")
            continue
        try:
            dense = DenseModule(
                folder=folder / sub, in_features=int(cfg["in_features"]), out_features=int(cfg["out_features"]),
                bias=bool(cfg.get("bias", True)),
                # sentence-transformers' Dense defaults to Tanh when the config names no activation
                activation=str(cfg.get("activation_function") or "torch.nn.modules.activation.Tanh"),
                use_residual=bool(cfg.get("use_residual", False)),
            )
        except KeyError as exc:
            raise InvalidInput(f"{where}: config.json lacks {exc.args[0]!r}") from exc
        steps.append(dense)
    if not pooled:
        raise Unsupported(f"{folder}: modules.json has no Pooling module: token embeddings are not an "
                          "embedding (serve it with task late_interaction for one vector per token)")
    normalize = False
    while steps and steps[-1] == "normalize":
        steps.pop()
        normalize = True
    return EmbedPipeline(override or mode, include_prompt, tuple(steps), normalize)
