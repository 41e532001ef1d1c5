"""Decoder embedders (Qwen3-Embedding / gte-Qwen2 layout): last-token pooling over the tokenizer's EOS,
instruction prompts from config_sentence_transformers.json. Parity with sentence-transformers (which pads on
the left, as the tokenizer says) on torch and on the ONNX graph our exporter writes; batched == single;
CTranslate2 (encoders only) refuses the folder by name."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import TesseraError
from core.tasks.embed import EmbedRequest
from tests.support import text_models
from tests.support.cache import ONNX_EXPORT_SOURCES, cached_build
from tests.support.engines import run_concurrently

SETTINGS = Settings(threads=2)
SOURCE = Path(text_models.__file__)
FAMILIES = ["qwen3", "qwen2"]
#: fp32: the decoder's RoPE positions differ between left (reference) and right (ours) padding only by a
#: shift, so the numbers agree up to float rounding
MIN_COSINE, MAX_ABS = 0.99999, 1e-5


@pytest.fixture(scope="session")
def decoder_dirs():
    built: dict[tuple[str, str], Path] = {}

    def get(family: str, backend: str = "torch") -> Path:
        if (family, backend) not in built:
            st_dir = cached_build(f"tiny-{family}-embedder", [SOURCE],
                                  partial(text_models.build_decoder_embedder, family=family))
            if backend == "onnx":
                pytest.importorskip("onnxruntime")
                from core.convert import onnx_export

                st_dir = cached_build(f"tiny-{family}-embedder-onnx", [SOURCE, *ONNX_EXPORT_SOURCES],
                                      lambda out: onnx_export.export_folder(st_dir, out))
            built[family, backend] = st_dir
        return built[family, backend]

    return get


@pytest.fixture(scope="session")
def decoder_reference(decoder_dirs, sentences):
    cache = {}

    def get(family: str, prompt_name: str | None) -> np.ndarray:
        if (family, prompt_name) not in cache:
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(str(decoder_dirs(family)), device="cpu")
            assert st.tokenizer.padding_side == "left"
            cache[family, prompt_name] = st.encode(sentences, batch_size=16, convert_to_numpy=True,
                                                   prompt_name=prompt_name)
        return cache[family, prompt_name]

    return get


@pytest.mark.parametrize("prompt_name", [None, "query"])
@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("family", FAMILIES)
def test_parity_with_sentence_transformers(decoder_dirs, decoder_reference, sentences, family, backend, prompt_name):
    engine = Engine.load(ModelSpec(path=decoder_dirs(family, backend), backend=backend), SETTINGS)
    assert engine.task.describe()["pooling"] == "lasttoken"
    ref = decoder_reference(family, prompt_name)
    got = engine.run_sync(EmbedRequest(texts=sentences, prompt_name=prompt_name)).vectors
    assert got.shape == ref.shape
    cos, diff = (got * ref).sum(1), np.abs(got - ref).max()
    print(f"\n[parity] {family} {backend} prompt={prompt_name}: max abs diff {diff:.2e}, min cosine {cos.min():.7f}")
    assert cos.min() >= MIN_COSINE and diff <= MAX_ABS, f"worst cosine {cos.min():.7f}, max abs diff {diff:.2e}"
    assert np.abs(ref - ref.mean(axis=0)).mean() > 100 * MAX_ABS  # items differ far more than the error


def test_the_pooled_token_is_the_tokenizers_eos(decoder_dirs):
    from core.tokenization import TextTokenizer

    tok = TextTokenizer(decoder_dirs("qwen3"), 128)
    eos = tok.token_to_id("<|endoftext|>")
    long_text = "word " * 400
    assert [int(e.ids[-1]) for e in tok.encode(["a short text", long_text])] == [eos, eos]  # kept when truncated


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_batched_through_batcher_equals_single(decoder_dirs, sentences, backend):
    texts = sentences[:24]
    engine = Engine.load(ModelSpec(path=decoder_dirs("qwen3", backend), backend=backend), SETTINGS)
    singles = np.stack([engine.run_sync(EmbedRequest(texts=[t], prompt_name="query")).vectors[0] for t in texts])
    results = run_concurrently(engine, [EmbedRequest(texts=[t], prompt_name="query") for t in texts])
    np.testing.assert_allclose(np.stack([r.vectors[0] for r in results]), singles, atol=2e-5)


def test_onnx_graph_has_no_past_key_values(decoder_dirs):
    import onnx

    graph = onnx.load(str(decoder_dirs("qwen3", "onnx") / "onnx" / "model.onnx"), load_external_data=False).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in graph.output] == ["last_hidden_state"]


def test_ct2_refuses_a_decoder_by_name(decoder_dirs):
    pytest.importorskip("ctranslate2")
    with pytest.raises(TesseraError, match="qwen3"):
        Engine.load(ModelSpec(path=decoder_dirs("qwen3"), backend="ct2"), SETTINGS)
