"""CTranslate2: conversion, loading and its refusals. Parity with sentence-transformers per compute type
is in tests/parity/test_embed_parity.py (the parity matrix)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.backends.ct2 import SUPPORTED_CONFIGS
from core.backends.registry import resolve_name
from core.config import ModelSpec, Settings
from core.convert.ct2 import convert_folder
from core.engine import Engine, Registry
from core.errors import InvalidInput, Unsupported
from core.tasks.embed import EmbedRequest

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = Settings(threads=2)


@pytest.fixture(scope="module")
def tiny_mpnet(tmp_path_factory, minilm_dir) -> Path:
    """A real (tiny, random) MPNet encoder folder with MiniLM's tokenizer: an architecture CTranslate2
    does not convert."""
    import shutil

    import transformers

    folder = tmp_path_factory.mktemp("tiny-mpnet")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm_dir / name, folder / name)
    cfg = transformers.MPNetConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=40)
    transformers.MPNetModel(cfg).save_pretrained(folder)
    return folder


def test_converted_folder_layout(minilm_ct2_dir):
    assert (minilm_ct2_dir / "ct2" / "model.bin").exists()
    assert (minilm_ct2_dir / "ct2" / "tokenizer.json").exists()
    for name in ("config.json", "tokenizer.json", "modules.json", "1_Pooling/config.json"):
        assert (minilm_ct2_dir / name).exists(), name
    assert not (minilm_ct2_dir / "model.safetensors").exists()  # the torch weights are not copied
    assert resolve_name(ModelSpec(path=minilm_ct2_dir)) == "ct2"


def test_ct2_engine_describes_its_compute_type(minilm_ct2_dir):
    engine = Engine.load(ModelSpec(path=minilm_ct2_dir, dtype="int8_float32"), SETTINGS)
    assert engine.describe()["backend"] == "ct2" and engine.describe()["compute_type"] == "int8_float32"


def test_unsupported_architecture_names_the_supported_ones(tiny_mpnet, tmp_path):
    with pytest.raises(Unsupported, match="model_type 'mpnet'") as info:
        convert_folder(tiny_mpnet, tmp_path / "out")
    for model_type in SUPPORTED_CONFIGS:
        assert model_type in info.value.message
    assert not (tmp_path / "out").exists()
    with pytest.raises(Unsupported, match="supported: bert"):
        Engine.load(ModelSpec(path=tiny_mpnet, backend="ct2"), SETTINGS)


def test_convert_script_reports_unsupported_architecture(tiny_mpnet, tmp_path):
    proc = subprocess.run([sys.executable, "scripts/convert_ct2.py", str(tiny_mpnet), str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "CTranslate2 has no encoder conversion" in proc.stderr


@pytest.mark.parametrize("kw,message", [
    ({"dtype": "float16"}, "float16/bfloat16 need a CUDA device"),
    ({"dtype": "bfloat16"}, "float16/bfloat16 need a CUDA device"),
    ({"dtype": "int4"}, "not supported"),
    ({"device": "cuda"}, "CTranslate2 sees no CUDA device"),
    ({"device": "tpu"}, "unknown device"),
])
def test_ct2_refusals(minilm_ct2_dir, kw, message):
    with pytest.raises(InvalidInput, match=message):
        Engine.load(ModelSpec(path=minilm_ct2_dir, backend="ct2", **kw), SETTINGS)


def test_unconverted_folder_names_the_converter(minilm_dir, tiny_mpnet):
    with pytest.raises(InvalidInput, match="scripts/convert_ct2.py"):
        Engine.load(ModelSpec(path=minilm_dir, backend="ct2"), SETTINGS)
    settings = Settings(threads=2, models=[ModelSpec(path=tiny_mpnet, name="bad", backend="ct2"),
                                           ModelSpec(path=minilm_dir, name="good", backend="torch")])
    registry = Registry.from_settings(settings)
    assert list(registry.engines) == ["good"] and "supported: bert" in registry.failed["bad"].error


def test_ct2_token_vectors_match_torch_on_a_padded_batch(minilm_ct2_dir, minilm_dir, sentences):
    ct2 = Engine.load(ModelSpec(path=minilm_ct2_dir, backend="ct2"), SETTINGS)
    torch = Engine.load(ModelSpec(path=minilm_dir, backend="torch"), SETTINGS)
    items = ct2.task.prepare(EmbedRequest(texts=sentences[:8]))
    feeds = ct2.task.collate(items)
    a = ct2.backend.run(feeds)["last_hidden_state"]
    b = torch.backend.run(feeds)["last_hidden_state"]
    mask = feeds["attention_mask"].astype(bool)
    assert a.shape == b.shape
    np.testing.assert_allclose(a[mask], b[mask], atol=1e-3)
    assert json.loads((minilm_ct2_dir / "ct2" / "config.json").read_text())  # CTranslate2's own config


def _tiny_encoder(folder: Path, minilm_dir: Path, model_type: str) -> Path:
    """A tiny random encoder of ``model_type`` with MiniLM's tokenizer (RoBERTa family: pad id 1, as real
    RoBERTa/XLM-R checkpoints have; their position ids are offset by it)."""
    import shutil

    import torch
    import transformers

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm_dir / name, folder / name)
    if model_type == "distilbert":
        cfg = transformers.DistilBertConfig(vocab_size=30522, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    else:
        cls = transformers.RobertaConfig if model_type == "roberta" else transformers.XLMRobertaConfig
        cfg = cls(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, pad_token_id=1, type_vocab_size=1)
    torch.manual_seed(0)
    transformers.AutoModel.from_config(cfg).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("model_type", ["distilbert", "roberta", "xlm-roberta"])
def test_other_supported_architectures_convert_and_match_torch(model_type, minilm_dir, tmp_path, sentences):
    (tmp_path / "src").mkdir()
    src = _tiny_encoder(tmp_path / "src", minilm_dir, model_type)
    out = convert_folder(src, tmp_path / "ct2")
    ct2 = Engine.load(ModelSpec(path=out), SETTINGS)
    torch = Engine.load(ModelSpec(path=src, backend="torch"), SETTINGS)
    assert ct2.backend.name == "ct2"
    a = ct2.run_sync(EmbedRequest(texts=sentences[:6])).vectors
    b = torch.run_sync(EmbedRequest(texts=sentences[:6])).vectors
    np.testing.assert_allclose(a, b, atol=1e-4)
