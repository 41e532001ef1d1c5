"""Which files of a Hub repository each backend fetches (core.hub.select_files), and Hub id recognition."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub.utils import filter_repo_objects

from core.backends.onnx import OnnxOptions
from core.errors import ModelUnavailable
from core.hub import _patterns, hub_id_of, select_files

META = ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
        "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json"]
#: a repository laid out as many published embedders are (bge, stella, EmbeddingGemma …)
REPO = META + [
    "README.md", ".gitattributes", "model.safetensors", "pytorch_model.bin", "training_args.bin",
    "2_Dense/config.json", "2_Dense/model.safetensors", "2_Dense/pytorch_model.bin",
    "onnx/model.onnx", "onnx/model.onnx_data", "onnx/model_fp16.onnx", "onnx/model_int8.onnx",
    "openvino/openvino_model.bin", "openvino/openvino_model.xml", "modeling_custom.py",
]


def test_torch_takes_safetensors_configs_and_module_folders_only():
    got = select_files(REPO, backend="torch")
    assert got == sorted(META + ["model.safetensors", "2_Dense/config.json", "2_Dense/model.safetensors"])


def test_torch_falls_back_to_bin_checkpoints_and_takes_shards_and_heads():
    bins = META + ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                   "pytorch_model.bin.index.json", "training_args.bin"]
    assert set(select_files(bins, backend="torch")) - set(META) == {
        "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json"}
    m3 = META + ["model.safetensors", "colbert_linear.pt", "sparse_linear.pt", "optimizer.pt"]
    assert set(select_files(m3, backend="torch")) - set(META) == {"model.safetensors", "colbert_linear.pt",
                                                                 "sparse_linear.pt"}


def test_stanford_colbert_settings_and_projection_are_fetched_for_every_backend():
    repo = META + ["artifact.metadata", "pytorch_model.bin", "onnx/model.onnx", "linear.safetensors", "ct2/model.bin"]
    for backend in ("torch", "onnx", "ct2"):
        assert {"artifact.metadata", "linear.safetensors"} <= set(select_files(repo, backend=backend))


def test_a_vision_language_embedders_processor_files_and_chat_template_are_fetched():
    repo = ["config.json", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "chat_template.json",
            "chat_template.jinja", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
            "model.safetensors.index.json", "gme_inference.py", "README.md"]
    assert set(select_files(repo, backend="auto")) == set(repo) - {"gme_inference.py", "README.md"}


def test_the_exporters_parity_record_travels_with_the_graph():
    repo = META + ["model.safetensors", "onnx/model.onnx", "onnx/parity.json", "modeling_lora.py"]
    assert "onnx/parity.json" in select_files(repo, backend="onnx")
    assert "onnx/parity.json" in select_files(repo, backend="auto", trust_remote_code=True)
    assert "onnx/parity.json" not in select_files(repo, backend="torch")


@pytest.mark.parametrize("dtype, graph", [("float32", "onnx/model.onnx"), ("int8", "onnx/model_int8.onnx"),
                                          ("float16", "onnx/model_fp16.onnx")])
def test_onnx_takes_the_graph_for_the_dtype_and_its_external_data(dtype, graph):
    got = set(select_files(REPO, backend="onnx", dtype=dtype))
    extra = {"onnx/model.onnx_data"} if graph == "onnx/model.onnx" else set()
    assert got == set(META) | {"2_Dense/config.json", "2_Dense/model.safetensors", graph} | extra


def test_onnx_file_names_a_graph_inside_the_repository():
    options = {"onnx": OnnxOptions(file=Path("custom/graph.onnx"))}
    got = select_files(REPO + ["custom/graph.onnx"], backend="onnx", options=options)
    assert "custom/graph.onnx" in got and "onnx/model.onnx" not in got


def test_auto_takes_weights_and_the_onnx_graph():
    got = set(select_files(REPO, backend="auto"))
    assert {"model.safetensors", "onnx/model.onnx", "onnx/model.onnx_data"} <= got
    assert not got & {"pytorch_model.bin", "onnx/model_int8.onnx", "openvino/openvino_model.bin", "README.md"}


def test_remote_code_only_when_trusted():
    assert "modeling_custom.py" not in select_files(REPO, backend="torch")
    assert "modeling_custom.py" in select_files(REPO, backend="torch", trust_remote_code=True)


@pytest.mark.parametrize("backend, files, message", [
    ("torch", META + ["onnx/model.onnx"], "no weights the torch backend reads"),
    ("onnx", META + ["model.safetensors"], r"no ONNX graph for dtype float32 \(looked for \['onnx/model.onnx'"),
    ("ct2", META + ["model.safetensors"], "no ct2/ folder"),
    ("auto", META, "no model weights"),
    ("tpu", META, "unknown backend 'tpu'"),
])
def test_what_a_repository_lacks_is_named(backend, files, message):
    with pytest.raises(ModelUnavailable, match=message):
        select_files(files, backend=backend)


def test_patterns_match_exactly_the_selected_files():
    files = REPO + ["weird[1].json", "x*.json", "2_Dense/q?.json"]
    wanted = select_files(files, backend="torch")
    assert sorted(filter_repo_objects(files, allow_patterns=_patterns(wanted))) == sorted(wanted)


@pytest.mark.parametrize("value, expected", [
    ("BAAI/bge-small-en-v1.5", "BAAI/bge-small-en-v1.5"), ("sentence-transformers/all-MiniLM-L6-v2", None),
    ("/models/bge", None), ("models", None), ("a/b/c", None), ("a/b--c", None), ("a/..b", None), ("a b/c", None),
])
def test_hub_ids(value, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if value.startswith("sentence-transformers/"):
        (tmp_path / value).mkdir(parents=True)  # a local folder of that name wins
    assert hub_id_of(value) == expected


def test_the_backend_names_a_spec_may_name_are_the_catalog_s():
    """The Hub's file selection takes the backends of the one list (core.backends.catalog), and no other."""
    from core.backends.catalog import names

    for name in names():
        select_files(REPO + ["ct2/model.bin", "neuron/manifest.json"], backend=name)  # each one known
    with pytest.raises(ModelUnavailable, match="unknown backend 'tensorrt'"):
        select_files(["config.json", "model.safetensors"], backend="tensorrt")
