"""Random-weight model folders of real sizes for the task comparisons (rerank, classify, CLIP), built from
configs with ``transformers`` and a fixed seed, saved once under ``.venv/models/``; no hub access.

- ``cross-encoder``: MiniLM-L6-sized BERT with a one-logit head (a reranker),
- ``classifier``: the same encoder with a 4-label head,
- ``clip``: ViT-B/32-sized CLIP (vision 768 × 12 layers, patch 32, 224 px; text 512 × 12 layers), with a
  byte-level BPE CLIP tokenizer built from the benchmark's words and a 224 px CLIP image processor.

The BERT folders reuse the packaged all-MiniLM-L6-v2 tokenizer files. Every builder takes ``sizes``
(config overrides), so the tests build the same folders at a tiny size.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.artifacts import MODELS_DIR

#: all-MiniLM-L6-v2's encoder shape
MINILM_L6 = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                 intermediate_size=1536, max_position_embeddings=512)
#: openai/clip-vit-base-patch32's shape
VIT_B32_TEXT = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8,
                    max_position_embeddings=77)
VIT_B32_VISION = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                      image_size=224, patch_size=32)
VIT_B32_PROJECTION = 512
CLASS_LABELS = {0: "world", 1: "sports", 2: "business", 3: "science"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
SEED = 0


def build_cross_encoder(tokenizer_dir: Path, out: Path, sizes: dict | None = None, seed: int = SEED) -> None:
    """A BERT cross-encoder (``BertForSequenceClassification``, one label) with random weights."""
    _build_bert_head(tokenizer_dir, out, dict(num_labels=1), sizes, seed)


def build_classifier(tokenizer_dir: Path, out: Path, sizes: dict | None = None, seed: int = SEED) -> None:
    """The same encoder with a 4-label head (``id2label`` from ``CLASS_LABELS``)."""
    _build_bert_head(tokenizer_dir, out, dict(num_labels=len(CLASS_LABELS), id2label=CLASS_LABELS,
                                              label2id={v: k for k, v in CLASS_LABELS.items()}), sizes, seed)


def _build_bert_head(tokenizer_dir: Path, out: Path, head: dict, sizes: dict | None, seed: int) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    # a wide init spreads the random logits, so scores differ clearly between inputs
    config = BertConfig(**{**MINILM_L6, **(sizes or {})}, initializer_range=0.2, **head)
    BertForSequenceClassification(config).eval().save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)


# ---- CLIP: a byte-level BPE tokenizer built locally ------------------------------------------------------

def bytes_to_unicode() -> list[str]:
    """GPT-2's byte → printable character table (the alphabet of byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def bpe_merges(words, suffix: str = "") -> list[tuple[str, str]]:
    """Merges that build each word from its characters, left to right (enough for a real BPE path)."""
    merges: list[tuple[str, str]] = []
    for word in words:
        pieces = list(word)
        if suffix:
            pieces[-1] += suffix
        while len(pieces) > 1:
            merge = (pieces[0], pieces[1])
            if merge not in merges:
                merges.append(merge)
            pieces = [pieces[0] + pieces[1]] + pieces[2:]
    return merges


def vocab_from(alphabet: list[str], merges: list[tuple[str, str]], specials: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for token in specials + alphabet + [a + b for a, b in merges]:
        vocab.setdefault(token, len(vocab))
    return vocab


def clip_tokenizer(words, max_length: int):
    """A CLIP tokenizer whose merges spell ``words`` whole (one token each), other text byte by byte."""
    from transformers import CLIPTokenizer

    chars = bytes_to_unicode()
    merges = bpe_merges(words, suffix="</w>")
    vocab = vocab_from(chars + [c + "</w>" for c in chars], merges, [])
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)


def build_clip(out: Path, sizes: dict | None = None, seed: int = SEED) -> None:
    """A CLIP folder with random weights: ``sizes`` may hold ``text``, ``vision`` (config overrides) and
    ``projection_dim``; defaults: ViT-B/32. The image processor resizes the shortest edge to the image size
    and centre-crops it (CLIP's preprocessing)."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    from benchmarks.texts import WORDS

    sizes = sizes or {}
    text = {**VIT_B32_TEXT, **sizes.get("text", {})}
    vision = {**VIT_B32_VISION, **sizes.get("vision", {})}
    tokenizer = clip_tokenizer(sorted(set(WORDS)), text["max_position_embeddings"])
    vocab = tokenizer.get_vocab()
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), bos_token_id=vocab["<|startoftext|>"],
                         eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"], **text),
        vision_config=vision, projection_dim=sizes.get("projection_dim", VIT_B32_PROJECTION),
    )
    CLIPModel(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    _write_clip_processor(out, vision["image_size"])


def _write_clip_processor(out: Path, size: int) -> None:
    """CLIP's image preprocessing as ``preprocessor_config.json`` under the class name every transformers
    version knows (``CLIPImageProcessor``), plus the processor's own file, so servers on different
    transformers versions load the same folder."""
    config = {
        "image_processor_type": "CLIPImageProcessor", "processor_class": "CLIPProcessor",
        "do_resize": True, "size": {"shortest_edge": size}, "resample": 3,
        "do_center_crop": True, "crop_size": {"height": size, "width": size},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(config, indent=1))
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "CLIPProcessor"}, indent=1))


# ---- the folders, built once --------------------------------------------------------------------------

def task_model_dir(task: str) -> Path:
    """The random-weight folder for ``task`` (``rerank``, ``classify``, ``clip``) under ``.venv/models/``,
    built the first time."""
    from core.config import default_model_path

    name, build = {
        "rerank": ("minilm-l6-cross-encoder-random", lambda out: build_cross_encoder(default_model_path(), out)),
        "classify": ("minilm-l6-classifier4-random", lambda out: build_classifier(default_model_path(), out)),
        "clip": ("clip-vit-b32-random", build_clip),
    }[task]
    out = MODELS_DIR / name
    if not (out / ".complete").exists():
        print(f"building {out} (random weights, seed {SEED}) ...", flush=True)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        build(out)
        (out / ".complete").write_text("ok")
    return out
