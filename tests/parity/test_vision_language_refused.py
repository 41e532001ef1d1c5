"""What is refused or bounded of the vision–language embedders, always by name with the reason and the alternative: the
Qwen2-VL layout (GME) on any backend but torch (serving and converters), a Qwen2-VL folder asked to run as a text
encoder, a Qwen2-VL-layout model with its own code, and Qwen3-VL's mixture-of-experts layout, which is not
implemented (never served as a text encoder, whose mean-pooled vectors would differ from the model card's
chat-template, last-token ones)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.config import ModelSpec, Settings
from core.convert.ct2 import convert_folder
from core.convert.neuron import compile_buckets
from core.convert.onnx_export import export_folder
from core.engine import Engine
from core.errors import Unsupported
from tests.support import vlm_models


@pytest.fixture(scope="module")
def gme_dir() -> Path:
    return vlm_models.gme_folder()


@pytest.mark.parametrize("backend", ["onnx", "ct2", "neuron"])
def test_other_backends_are_refused_by_name(gme_dir, backend):
    with pytest.raises(Unsupported, match=f"vision–language embedder.*backend {backend!r} would compute other "
                                          "vectors or none; serve it with backend 'torch'"):
        Engine.load(ModelSpec(path=gme_dir, backend=backend), Settings(threads=2))


def test_auto_serves_torch_whatever_artifacts_the_folder_holds(gme_dir, tmp_path):
    """A text-only graph or a CTranslate2 model beside the weights (exported by another tool) is never served."""
    folder = tmp_path / "gme"
    shutil.copytree(gme_dir, folder)
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(b"not a graph")
    (folder / "ct2").mkdir()
    (folder / "ct2" / "model.bin").write_bytes(b"not a model")
    engine = Engine.load(ModelSpec(path=folder, backend="auto"), Settings(threads=2), warm_up=False)
    assert engine.backend.name == "torch" and engine.task.name == "vlm_embed"


@pytest.mark.parametrize("convert", ["onnx", "ct2", "neuron"])
def test_converters_refuse_before_writing(gme_dir, tmp_path, convert):
    out = tmp_path / "out"
    run = {"onnx": lambda: export_folder(gme_dir, out),
           "ct2": lambda: convert_folder(gme_dir, out),
           "neuron": lambda: compile_buckets(gme_dir, out, compile_bucket=lambda *a, **k: None)}[convert]
    with pytest.raises(Unsupported, match="vision–language embedder.*Serve the folder itself with backend 'torch'"):
        run()
    assert not out.exists()


def test_task_embed_on_a_qwen2_vl_folder_names_the_vlm_task(gme_dir):
    with pytest.raises(Unsupported, match="'qwen2_vl' is a vision–language model.*Serve it with task 'vlm_embed'"):
        Engine.load(ModelSpec(path=gme_dir, backend="torch", task="embed"), Settings(threads=2))


@pytest.mark.parametrize("task", ["auto", "embed"])
def test_qwen3_vl_moe_layout_is_refused_with_the_alternative(gme_dir, tmp_path, task):
    """Qwen3-VL's mixture-of-experts layout is not implemented (nor tested): refused at load, never a text encoder."""
    folder = tmp_path / "qwen3-vl-moe"
    shutil.copytree(gme_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="qwen3_vl_moe", architectures=["Qwen3VLMoeForConditionalGeneration"])
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(Unsupported, match="'qwen3_vl_moe' is a vision–language model.*not implemented.*model card"):
        Engine.load(ModelSpec(path=Path(folder), backend="torch", task=task), Settings(threads=2))


def test_a_qwen2_vl_model_with_its_own_code_is_refused(gme_dir, tmp_path):
    """jina-embeddings-v4's layout: Qwen2.5-VL with its own code (task adapters, its own pooling), trusted or not."""
    folder = tmp_path / "own-code"
    shutil.copytree(gme_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_jina_embeddings_v4.JinaEmbeddingsV4Model"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(Unsupported, match="its own code.*Serve it with its model card's code"):
        Engine.load(ModelSpec(path=folder, backend="torch", trust_remote_code=True), Settings(threads=2))
    with pytest.raises(Unsupported, match="trust_remote_code"):
        Engine.load(ModelSpec(path=folder, backend="torch"), Settings(threads=2))


def test_one_image_becomes_at_most_1280_tokens_whatever_the_folders_max_pixels(gme_dir, tmp_path):
    """Qwen2-VL's own preprocessor_config allows 16384 tokens (12 845 056 pixels) per image; the server resizes
    within GME's model card bound (1280 tokens), so a large image stays cheap."""
    import base64
    import io

    from PIL import Image

    from core.media import MediaFetcher
    from core.tasks.embed import EmbedRequest
    from core.tasks.vlm_embed import MAX_IMAGE_TOKENS

    folder = tmp_path / "gme-wide"
    shutil.copytree(gme_dir, folder)
    config = json.loads((folder / "preprocessor_config.json").read_text())
    config["max_pixels"] = 12845056
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    engine = Engine.load(ModelSpec(path=folder, backend="torch"), Settings(threads=2), warm_up=False)
    buf = io.BytesIO()
    Image.new("RGB", (3000, 2000), (9, 99, 199)).save(buf, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    (item,) = engine.task.prepare(EmbedRequest(modality="image", inputs=[uri], media=MediaFetcher()))
    image_tokens = int(item.arrays["mm_token_type_ids"].sum())
    assert 1000 < image_tokens <= MAX_IMAGE_TOKENS
    assert item.cost == item.length and item.cost > image_tokens  # the image's tokens are the item's cost
