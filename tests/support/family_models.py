"""Tiny model folders of the families users bring, saved the way their published repositories are: built
from a config with transformers, written by sentence-transformers' ``save`` (or ``save_pretrained``), with
the real all-MiniLM-L6-v2 tokenizer where the family's own tokenizer does not matter to the numbers.
Builders take the output folder (see ``tests/support/cache.py`` ``cached_build``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.support.text_models import _copy_tokenizer

#: prompts saved in config_sentence_transformers.json (a query prompt and an empty document prompt)
PROMPTS = {"query": "query: ", "document": ""}


def _dense(torch, models, in_features: int, out_features: int, *, bias: bool, activation):
    dense = models.Dense(in_features, out_features, bias=bias, activation_function=activation)
    with torch.no_grad():  # a wide init, so the projection changes the vectors clearly
        dense.linear.weight.normal_(0, 1.5 / in_features ** 0.5)
    return dense


# --- T5 encoders (sentence-t5 / GTR layout) -----------------------------------------------------------------

def build_t5_encoder(minilm: Path, out: Path) -> None:
    """sentence-t5 / GTR: a T5 encoder (``T5EncoderModel``, config ``model_type: t5``) → mean Pooling → Dense
    (no bias, Identity) → Normalize, saved by sentence-transformers, with a query prompt."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(41)
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp)
        config = T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, relative_attention_max_distance=32,
                          pad_token_id=0, eos_token_id=102, decoder_start_token_id=0, initializer_factor=1.0)
        T5EncoderModel(config).eval().save_pretrained(hf)
        _copy_tokenizer(minilm, hf)
        transformer = models.Transformer(str(hf), max_seq_length=128)
        dense = _dense(torch, models, 32, 24, bias=False, activation=torch.nn.Identity())
        st = SentenceTransformer(modules=[transformer, models.Pooling(32, pooling_mode="mean"), dense,
                                          models.Normalize()], device="cpu")
        st.prompts = dict(PROMPTS)
        st.save(str(out))
