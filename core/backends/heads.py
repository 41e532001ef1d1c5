"""Model heads: which ``transformers`` class a torch backend loads for a task, how it is called, and the
named outputs every backend returns for it. Tasks name a head; backends look it up here."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable


@functools.lru_cache(maxsize=None)
def _takes_use_cache(cls: type) -> bool:
    import inspect

    return "use_cache" in inspect.signature(cls.forward).parameters


def _hidden_states(model: Any, feeds: dict) -> dict:
    """Token vectors. Decoders (Qwen3/Qwen2 embedders) run without a key/value cache: one forward pass, and
    the ONNX export of this call is the past-key-values-free graph."""
    extra = {"use_cache": False} if _takes_use_cache(type(model)) else {}
    return {"last_hidden_state": model(**feeds, **extra).last_hidden_state}


def _pooled(out: Any) -> Any:
    """transformers 5.x ``get_*_features`` return an output object (the embedding is ``pooler_output``);
    older versions return the tensor itself."""
    return out if hasattr(out, "shape") else out.pooler_output


def _towers(model: Any, feeds: dict) -> dict:
    """Dual encoders (CLIP, SigLIP, CLAP): one head, the tower chosen by the inputs present. A batch holds
    one modality only (the task groups batches by modality), so exactly one tower runs per call."""
    if "pixel_values" in feeds:  # SigLIP 2 (NaFlex): the patch mask and each image's patch grid too
        image = {k: feeds[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes") if k in feeds}
        out = model.get_image_features(**image)
    elif "input_features" in feeds:
        audio = {k: feeds[k] for k in ("input_features", "is_longer") if k in feeds}
        out = model.get_audio_features(**audio)
    else:
        text = {k: feeds[k] for k in ("input_ids", "attention_mask") if k in feeds}
        out = model.get_text_features(**text)
    return {"embeddings": _pooled(out)}


def _multi_vector(model: Any, feeds: dict) -> dict:
    """ColPali: one projected, L2-normalized vector per token (page-image patches or query tokens)."""
    return {"embeddings": model(**feeds).embeddings}


def _vlm_last_token(model: Any, feeds: dict) -> dict:
    """Vision–language embedders (Qwen2-VL layout): the last hidden state at each row's last real token (rows are
    right-padded), (batch, hidden). The model computes the M-RoPE positions from ``mm_token_type_ids`` and
    ``image_grid_thw`` and merges the vision tower's output into the image tokens."""
    import torch

    extra = {"use_cache": False} if _takes_use_cache(type(model)) else {}
    hidden = model(**feeds, **extra).last_hidden_state
    last = feeds["attention_mask"].sum(dim=1) - 1
    return {"embeddings": hidden[torch.arange(hidden.shape[0], device=hidden.device), last]}


def _logits(model: Any, feeds: dict) -> dict:
    return {"logits": model(**feeds).logits}


@functools.lru_cache(maxsize=None)
def _takes_logits_to_keep(cls: type) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def _next_token_logits(model: Any, feeds: dict) -> dict:
    """Causal LMs (LLM rerankers): the logits of the token after the last position, (batch, vocab). Inputs
    are padded on the left, so the last position is every row's last real token; one forward pass without
    a key/value cache, and only the last position goes through the LM head."""
    extra = {"use_cache": False} if _takes_use_cache(type(model)) else {}
    if _takes_logits_to_keep(type(model)):
        extra["logits_to_keep"] = 1
    return {"next_token_logits": model(**feeds, **extra).logits[:, -1]}


def _splade(model: Any, feeds: dict) -> dict:
    """SPLADE pooled in the framework: max over tokens of log1p(relu(logits)), padding masked. Keeps the
    (batch, seq, vocab) logits on the device instead of copying them out."""
    import torch

    logits = model(**feeds).logits
    # log1p(relu(.)) is monotonic: take the max over the sequence first, then activate (batch, vocab) only
    padding = (feeds["attention_mask"] == 0).unsqueeze(-1)
    best = logits.masked_fill_(padding, float("-inf")).amax(dim=1)
    return {"sparse_embedding": torch.log1p(torch.relu(best))}


@dataclass(frozen=True)
class Head:
    name: str
    auto_class: str  # transformers class name used by the torch backend (see ``model_class_name``)
    outputs: tuple[str, ...]  # output names, the same on every backend (ONNX graphs are exported with them)
    call: Callable[[Any, dict], dict]  # torch: model, feeds → {output name: tensor}
    #: the feeds the call takes; None: those named in the model's forward signature (torch)
    inputs: tuple[str, ...] | None = None
    #: why only the torch backend computes this head (None: every backend may); the backend choice refuses the
    #: others by name and ``auto`` picks torch, whatever artifacts the folder holds
    torch_only: str | None = None


HEADS: dict[str, Head] = {
    "encoder": Head("encoder", "AutoModel", ("last_hidden_state",), _hidden_states),
    "towers": Head("towers", "AutoModel", ("embeddings",), _towers),
    # token_type_ids reach PaliGemma through **kwargs: all-zero = bidirectional prefix attention
    "colpali": Head("colpali", "ColPaliForRetrieval", ("embeddings",), _multi_vector,
                    ("input_ids", "attention_mask", "token_type_ids", "pixel_values")),
    # cross-encoders and classifiers: (batch, num_labels)
    "sequence-classification": Head("sequence-classification", "AutoModelForSequenceClassification", ("logits",), _logits),
    # LLM rerankers: the next token's logits after a left-padded prompt, (batch, vocab)
    "causal-lm": Head("causal-lm", "AutoModelForCausalLM", ("next_token_logits",), _next_token_logits,
                      ("input_ids", "attention_mask")),
    # vision–language embedders (Qwen2-VL layout): the last real token's state, (batch, hidden)
    "vlm-last-token": Head("vlm-last-token", "AutoModel", ("embeddings",), _vlm_last_token,
                           ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"),
                           torch_only="a vision–language embedder (Qwen2-VL layout): its vision tower and M-RoPE "
                                      "positions have no ONNX export, CTranslate2 conversion or Neuron compilation"),
    # SPLADE: (batch, seq, vocab)
    "masked-lm": Head("masked-lm", "AutoModelForMaskedLM", ("logits",), _logits),
    # SPLADE, pooled: (batch, vocab)
    "splade": Head("splade", "AutoModelForMaskedLM", ("sparse_embedding",), _splade),
}


def get_head(name: str) -> Head:
    from core.errors import InvalidInput

    if name not in HEADS:
        raise InvalidInput(f"unknown model head {name!r}; known: {sorted(HEADS)}")
    return HEADS[name]


#: encoder–decoder families whose encoder alone is an embedding model (sentence-t5, GTR): model_type → the
#: transformers class of the encoder, as sentence-transformers loads it
ENCODER_ONLY_CLASSES = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel"}


def accepted_inputs(model: Any) -> frozenset[str]:
    """The inputs a model's forward takes by name. A forward that names none of them and passes everything on
    (``forward(self, *args, **kwargs)``: jina-embeddings-v3's own code wraps its encoder so) takes what the model
    it wraps (``base_model``) names: filtering the feeds by the wrapper's own signature would pass nothing."""
    import inspect

    params = inspect.signature(model.forward).parameters
    named = frozenset(n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    passes_on = any(p.kind == p.VAR_KEYWORD for p in params.values())
    base = getattr(model, "base_model", None)
    if "input_ids" not in named and passes_on and base is not None and base is not model:
        return accepted_inputs(base)
    return named


def model_class_name(head_name: str, config: dict) -> str:
    """The transformers class a head loads for a folder's ``config.json``: the head's class, except that the
    ``encoder`` head follows the model's ``architectures`` where ``AutoModel`` would build something else —
    an encoder–decoder config (``model_type: t5``) gets its encoder-only class (``T5EncoderModel``: ``AutoModel``
    is the whole encoder–decoder, whose forward needs decoder inputs). A model with its own code
    (``auto_map``) keeps ``AutoModel``, which loads that code. Raises ``Unsupported`` for an encoder–decoder
    family without an encoder-only class."""
    head = get_head(head_name)
    if head.name != "encoder" or "AutoModel" in (config.get("auto_map") or {}):
        return head.auto_class
    for arch in config.get("architectures") or ():
        if arch in ENCODER_ONLY_CLASSES.values():
            return arch
    model_type = config.get("model_type")
    if model_type in ENCODER_ONLY_CLASSES:
        return ENCODER_ONLY_CLASSES[model_type]
    if config.get("is_encoder_decoder"):
        from core.errors import Unsupported

        raise Unsupported(
            f"model_type {model_type!r} is an encoder–decoder model (architectures {config.get('architectures')}); "
            f"embeddings come from an encoder alone, and the encoder-only classes known here are those of "
            f"{sorted(ENCODER_ONLY_CLASSES)} ({', '.join(sorted(ENCODER_ONLY_CLASSES.values()))}); save its "
            "encoder as an encoder model (sentence-transformers does for T5) and serve that folder",
            code="unsupported_architecture")
    return head.auto_class


def load_head_class(model_dir, head_name: str, extra: str):
    """The transformers class (``model_class_name``) for the folder's ``config.json``; ``extra``: the
    install extra named when transformers is missing."""
    import json
    from pathlib import Path

    from core.errors import require

    transformers = require("transformers", extra)
    config_file = Path(model_dir) / "config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    return getattr(transformers, model_class_name(head_name, config))


def is_feed_forward(name: str) -> bool:
    """Whether a weight of a BERT-family encoder belongs to a feed-forward block (``intermediate.dense``,
    ``output.dense``) rather than to attention (``attention.output.dense``): the layers int8 keeps fp32
    (the torch backend's int8, the ONNX "accurate" int8 graph). ``name`` is a torch module name
    (``encoder.layer.0.intermediate.dense``) or a node name of the exported graph
    (``/encoder/layer.0/intermediate/dense/MatMul``)."""
    parts = re.split(r"[./]", name)
    if "intermediate" in parts:
        return True
    return ("output", "dense") in zip(parts, parts[1:]) and "attention" not in parts
