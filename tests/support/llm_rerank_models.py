"""Tiny LLM-reranker folders (Qwen3-Reranker layout) built from a config: a random ``Qwen3ForCausalLM`` with
a byte-level BPE tokenizer that has Qwen's chat special tokens, ``<think>``/``</think>`` and single "yes"/"no"
tokens. Two layouts: the original one (transformers files only, the folder named as a reranker) and the
sentence-transformers one (``modules.json`` with Transformer → LogitScore, the reranker chat template,
the instruction as the default prompt), saved by sentence-transformers' CrossEncoder."""

from __future__ import annotations

from pathlib import Path

from core.tasks.llm_rerank import DEFAULT_INSTRUCTION, PREFIX, SUFFIX
from tests.support.text_models import save_qwen_style_tokenizer, train_qwen_style_bpe

#: the reranker chat template Qwen3-Reranker ships for sentence-transformers (roles system = instruction,
#: query, document); it renders PREFIX + "<Instruct>: …\n<Query>: …\n<Document>: …" + SUFFIX
CHAT_TEMPLATE = (
    '{%- set instruction = messages | selectattr("role", "eq", "system") | map(attribute="content") | first'
    ' | default("' + DEFAULT_INSTRUCTION + '") -%}\n'
    '{%- set query_text = messages | selectattr("role", "eq", "query") | map(attribute="content") | first -%}\n'
    '{%- set document_text = messages | selectattr("role", "eq", "document") | map(attribute="content")'
    ' | first -%}\n'
    + PREFIX + "<Instruct>: {{ instruction }}\n<Query>: {{ query_text }}\n<Document>: {{ document_text }}"
    + SUFFIX + "\n"
)


def build_tokenizer(out: Path) -> None:
    from tokenizers import AddedToken

    from tests.support.sentences import SENTENCES

    corpus = list(SENTENCES) + [PREFIX, SUFFIX, DEFAULT_INSTRUCTION] + ["yes\nno\n" * 20] * 20
    tok = train_qwen_style_bpe(corpus, 900)
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    for word in ("yes", "no"):
        assert tok.token_to_id(word) is not None, word
    save_qwen_style_tokenizer(tok, out, eos_token="<|im_end|>")


def build_causal_lm(out: Path) -> None:
    """The original Qwen3-Reranker layout: config.json (Qwen3ForCausalLM), weights, tokenizer."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    build_tokenizer(out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    pad = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(41)
    config = Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                         eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=pad, bos_token_id=None,
                         tie_word_embeddings=True, initializer_range=0.2)
    Qwen3ForCausalLM(config).eval().save_pretrained(out)


def build_st_layout(causal_lm: Path, out: Path) -> None:
    """The same weights re-saved by sentence-transformers' CrossEncoder (Transformer → LogitScore), with the
    reranker chat template and the default instruction as its ``query`` prompt, as Qwen3-Reranker ships."""
    import shutil
    import tempfile

    from sentence_transformers import CrossEncoder

    with tempfile.TemporaryDirectory() as tmp:  # the template must be there when the Transformer module loads
        src = Path(tmp) / "src"
        shutil.copytree(causal_lm, src)
        (src / "chat_template.jinja").write_text(CHAT_TEMPLATE)
        model = CrossEncoder(str(src), device="cpu")
        model.prompts = {"query": DEFAULT_INSTRUCTION}
        model.default_prompt_name = "query"
        model.save(str(out))
