"""T5 encoders (sentence-t5 / GTR layout: ``T5EncoderModel`` → mean Pooling → Dense → Normalize): the encoder
head loads the encoder-only class the config's ``architectures`` names (``AutoModel`` would build the whole
encoder–decoder, whose forward asks for decoder inputs). Parity with sentence-transformers, with and without
a prompt, on torch, on the ONNX graph our exporter writes and under ``auto`` (exported into the cache);
CTranslate2 refuses the folder by name; an encoder–decoder family without an encoder-only class is refused."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.backends.heads import model_class_name
from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import TesseraError, Unsupported
from core.tasks.embed import EmbedRequest
from tests.support import family_models, text_models
from tests.support.cache import ONNX_EXPORT_SOURCES, cached_build

SOURCES = [Path(family_models.__file__), Path(text_models.__file__)]
MIN_COSINE, MAX_ABS = 0.99999, 1e-5


@pytest.fixture(scope="session")
def t5_dir(minilm_dir) -> Path:
    return cached_build("tiny-sentence-t5", SOURCES, partial(family_models.build_t5_encoder, minilm_dir))


@pytest.fixture(scope="session")
def t5_onnx_dir(t5_dir) -> Path:
    pytest.importorskip("onnxruntime")
    from core.convert import onnx_export

    return cached_build("tiny-sentence-t5-onnx", [*SOURCES, *ONNX_EXPORT_SOURCES],
                        lambda out: onnx_export.export_folder(t5_dir, out))


@pytest.fixture(scope="session")
def t5_reference(t5_dir, sentences):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(t5_dir), device="cpu")
    assert type(st[0].auto_model).__name__ == "T5EncoderModel"
    return {p: st.encode(sentences, batch_size=16, convert_to_numpy=True, prompt_name=p) for p in (None, "query")}


def test_folder_is_saved_as_sentence_t5_is(t5_dir):
    config = json.loads((t5_dir / "config.json").read_text())
    assert config["model_type"] == "t5" and config["architectures"] == ["T5EncoderModel"]
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((t5_dir / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Dense", "Normalize"]


@pytest.mark.parametrize("prompt_name", [None, "query"])
@pytest.mark.parametrize("backend", ["torch", "onnx", "auto"])
def test_parity_with_sentence_transformers(t5_dir, t5_onnx_dir, t5_reference, sentences, tmp_path_factory,
                                           backend, prompt_name):
    folder = t5_onnx_dir if backend == "onnx" else t5_dir
    settings = Settings(threads=2, auto_export=True, cache_dir=tmp_path_factory.mktemp("t5-cache"))
    engine = Engine.load(ModelSpec(path=folder, backend=backend), settings)
    assert engine.backend.name == ("torch" if backend == "torch" else "onnx"), engine.choice.reason
    ref = t5_reference[prompt_name]
    got = engine.run_sync(EmbedRequest(texts=sentences, prompt_name=prompt_name)).vectors
    assert got.shape == ref.shape == (len(sentences), 24)
    cos, diff = (got * ref).sum(1), np.abs(got - ref).max()
    print(f"\n[parity] sentence-t5 {backend} prompt={prompt_name}: max abs diff {diff:.2e}, min cosine {cos.min():.7f}")
    assert cos.min() >= MIN_COSINE and diff <= MAX_ABS
    assert np.abs(ref - ref.mean(axis=0)).mean() > 100 * MAX_ABS  # items differ far more than the error


def test_onnx_graph_is_the_encoder_alone(t5_onnx_dir):
    import onnx

    graph = onnx.load(str(t5_onnx_dir / "onnx" / "model.onnx"), load_external_data=False).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in graph.output] == ["last_hidden_state"]


def test_ct2_refuses_t5_by_name(t5_dir):
    pytest.importorskip("ctranslate2")
    with pytest.raises(TesseraError, match="'t5'.*backend 'torch' or 'onnx'"):
        Engine.load(ModelSpec(path=t5_dir, backend="ct2"), Settings(threads=2))


@pytest.mark.parametrize("config, expected", [
    ({"model_type": "t5", "architectures": ["T5EncoderModel"]}, "T5EncoderModel"),
    # a full encoder–decoder checkpoint served as an embedder: its encoder, as sentence-transformers loads it
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True},
     "T5EncoderModel"),
    ({"model_type": "mt5", "architectures": ["MT5EncoderModel"]}, "MT5EncoderModel"),
    ({"model_type": "bert", "architectures": ["BertModel"]}, "AutoModel"),
    # custom code (auto_map) is loaded by the Auto class
    ({"model_type": "t5", "auto_map": {"AutoModel": "modeling.Custom"}}, "AutoModel"),
])
def test_encoder_class_follows_architectures(config, expected):
    assert model_class_name("encoder", config) == expected
    assert model_class_name("sequence-classification", config) == "AutoModelForSequenceClassification"


def test_encoder_decoder_without_encoder_class_is_refused_with_the_alternative(tmp_path):
    from transformers import BartConfig, BartModel

    BartModel(BartConfig(vocab_size=100, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                         decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                         max_position_embeddings=64)).save_pretrained(tmp_path)
    with pytest.raises(Unsupported, match="'bart' is an encoder–decoder.*encoder-only classes.*T5EncoderModel"):
        model_class_name("encoder", json.loads((tmp_path / "config.json").read_text()))
