"""SigLIP 2 beside SigLIP: the NaFlex layout (``Siglip2Model``; each image cut into at most ``max_num_patches``
patches at its own aspect ratio, with ``pixel_attention_mask`` and ``spatial_shapes``) is served by the clip
task. Parity with the model card's transformers code on a tiny model built from a config: text (padded to
``max_length``) and images of different aspect ratios, one request and concurrent single-item requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.tasks.embed import EmbedRequest
from tests.multimodal import tiny_models
from tests.multimodal.media_support import data_uri, png
from tests.multimodal.test_parity import COS, IMAGES, TEXTS, _pil, cosine, serve
from tests.support.cache import cached_build

#: a wide and a tall image beside IMAGES: different patch grids in one batch
SHAPES = IMAGES + [png((80, 20), (0, 0, 255), shape="square"), png((16, 72), (0, 120, 255), shape="circle")]


@pytest.fixture(scope="module")
def siglip2():
    folder = cached_build("tiny-siglip2", [Path(tiny_models.__file__)], tiny_models.build_siglip2)
    from transformers import AutoProcessor, Siglip2Model

    engine = Engine.load(ModelSpec(path=folder), Settings(models=[]))
    return engine, Siglip2Model.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)


def test_siglip2_is_served_by_the_clip_task(siglip2):
    engine, _, _ = siglip2
    assert engine.task.name == "clip" and engine.describe()["modalities"] == ["text", "image"]
    assert engine.backend.name == "torch"


def test_siglip2_text_matches_the_model_card_code(siglip2):
    engine, model, proc = siglip2
    with torch.inference_mode():  # the model card: padding="max_length" to the text tower's length
        ref = model.get_text_features(**proc(text=TEXTS, padding="max_length", max_length=16, truncation=True,
                                             return_tensors="pt")).pooler_output.numpy()
    ours = engine.run_sync(EmbedRequest(texts=TEXTS)).vectors
    each = np.stack([r.vectors[0] for r in serve(engine, [EmbedRequest(texts=[t]) for t in TEXTS])])
    print(f"\n[parity] siglip2 text torch: min cosine {min(cosine(ours, ref).min(), cosine(each, ref).min()):.7f}")
    assert cosine(ours, ref).min() >= COS and cosine(each, ref).min() >= COS


def test_siglip2_images_of_any_aspect_ratio_match_the_model_card_code(siglip2):
    engine, model, proc = siglip2
    pils = [_pil(b) for b in SHAPES]
    inputs = proc(images=pils, return_tensors="pt")
    assert len({tuple(s) for s in inputs["spatial_shapes"].tolist()}) > 1  # the grids differ
    with torch.inference_mode():
        ref = model.get_image_features(**inputs).pooler_output.numpy()
    uris = [data_uri(b, "image/png") for b in SHAPES]
    ours = engine.run_sync(EmbedRequest(modality="image", inputs=uris)).vectors
    record: list = []
    each = np.stack([r.vectors[0] for r in serve(engine, [EmbedRequest(modality="image", inputs=[u]) for u in uris],
                                                 record)])
    print(f"\n[parity] siglip2 image torch: min cosine {min(cosine(ours, ref).min(), cosine(each, ref).min()):.7f}")
    assert cosine(ours, ref).min() >= COS and cosine(each, ref).min() >= COS
    assert all({"pixel_attention_mask", "spatial_shapes"} <= set(shapes) for shapes in record)
