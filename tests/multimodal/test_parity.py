"""Parity of the served CLIP / CLAP / ColPali embeddings with the ``transformers`` reference forward on the
same tiny weights (cosine ≥ 0.9999), for text, image and audio, single and batched, through the real
engine (media as data URIs, the batcher coalescing concurrent requests)."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import torch

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import InvalidInput
from core.tasks.embed import EmbedRequest
from tests.multimodal.media_support import audio_bytes, data_uri, png, sine

COS = 0.9999
TEXTS = ["a photo of a dog", "red", "the blue square of a cat photo with a long caption", "green circle"]
IMAGES = [
    png((40, 30), (255, 0, 0), shape="circle"),
    png((64, 64), (0, 255, 0), shape="square"),
    png((30, 50), (200, 200, 0), shape=None),
]


def cosine(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def serve(engine: Engine, requests: list[EmbedRequest], record: list | None = None):
    """Run the requests concurrently through the engine's batcher (as the server does)."""
    original = engine.backend.run

    def spy(inputs):
        if record is not None:
            record.append({k: v.shape for k, v in inputs.items()})
        return original(inputs)

    async def main():
        engine.backend.run = spy
        await engine.batcher.start()
        try:
            return await asyncio.gather(*(engine(r) for r in requests))
        finally:
            await engine.batcher.stop()
            engine.backend.run = original

    return asyncio.run(main())


def _engine(folder) -> Engine:
    return Engine.load(ModelSpec(path=folder), Settings(models=[]))


def _pil(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


# CLIP -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clip(clip_dir):
    from transformers import AutoProcessor, CLIPModel

    return _engine(clip_dir), CLIPModel.from_pretrained(clip_dir).eval(), AutoProcessor.from_pretrained(clip_dir)


def test_clip_text_single_and_batched(clip):
    engine, model, proc = clip
    with torch.inference_mode():
        single = [model.get_text_features(**proc.tokenizer([t], return_tensors="pt")).pooler_output[0].numpy()
                  for t in TEXTS]
        batched = model.get_text_features(**proc.tokenizer(TEXTS, padding=True, return_tensors="pt")).pooler_output
    ours_batch = engine.run_sync(EmbedRequest(texts=TEXTS)).vectors
    ours_each = [r.vectors[0] for r in serve(engine, [EmbedRequest(texts=[t]) for t in TEXTS])]
    for ours in (ours_batch, np.stack(ours_each)):
        assert cosine(ours, np.stack(single)).min() >= COS
        assert cosine(ours, batched.numpy()).min() >= COS
    assert np.allclose(np.linalg.norm(ours_batch, axis=1), 1.0, atol=1e-5)  # normalized by default


def test_clip_image_single_and_batched(clip):
    engine, model, proc = clip
    pils = [_pil(b) for b in IMAGES]
    with torch.inference_mode():
        ref = model.get_image_features(**proc.image_processor(pils, return_tensors="pt")).pooler_output.numpy()
        single = [model.get_image_features(**proc.image_processor([p], return_tensors="pt")).pooler_output[0].numpy()
                  for p in pils]
    uris = [data_uri(b, "image/png") for b in IMAGES]
    ours = engine.run_sync(EmbedRequest(modality="image", inputs=uris)).vectors
    assert cosine(ours, ref).min() >= COS and cosine(ours, np.stack(single)).min() >= COS
    each = serve(engine, [EmbedRequest(modality="image", inputs=[u]) for u in uris])
    assert cosine(np.stack([r.vectors[0] for r in each]), ref).min() >= COS
    assert each[0].prompt_tokens == (32 // 8) ** 2 + 1  # cost = image patches + class token


def test_clip_text_and_image_never_share_a_backend_call(clip):
    engine, model, proc = clip
    uris = [data_uri(b, "image/png") for b in IMAGES]
    requests = [EmbedRequest(texts=[TEXTS[i % 4]]) if i % 2 else EmbedRequest(modality="image", inputs=[uris[i % 3]])
                for i in range(12)]
    calls: list[dict] = []
    results = serve(engine, requests, record=calls)
    assert calls and all(("pixel_values" in c) != ("input_ids" in c) for c in calls)
    assert max(next(iter(c.values()))[0] for c in calls) > 1  # concurrent requests were batched
    with torch.inference_mode():
        for request, result in zip(requests, results):
            if request.modality == "image":
                feats = proc.image_processor([_pil(IMAGES[uris.index(request.inputs[0])])], return_tensors="pt")
                ref = model.get_image_features(**feats).pooler_output[0].numpy()
            else:
                ref = model.get_text_features(**proc.tokenizer(request.texts, return_tensors="pt")).pooler_output[0]
            assert cosine(result.vectors[0], np.asarray(ref)) >= COS


def test_clip_dimensions_truncate_and_renormalize(clip):
    engine, _, _ = clip
    full = engine.run_sync(EmbedRequest(texts=TEXTS, normalize=False)).vectors
    short = engine.run_sync(EmbedRequest(texts=TEXTS, dimensions=8)).vectors
    assert short.shape == (4, 8)
    assert np.allclose(short, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=1e-6)
    with pytest.raises(InvalidInput, match="modalities: \\['text', 'image'\\]"):
        engine.run_sync(EmbedRequest(modality="audio", inputs=["data:audio/wav;base64,AAAA"]))


def test_siglip_style_text_and_image(siglip_dir):
    from transformers import AutoProcessor, SiglipModel

    engine = _engine(siglip_dir)
    model, proc = SiglipModel.from_pretrained(siglip_dir).eval(), AutoProcessor.from_pretrained(siglip_dir)
    assert engine.task.name == "clip" and engine.describe()["modalities"] == ["text", "image"]
    pils = [_pil(b) for b in IMAGES]
    with torch.inference_mode():
        ref_t = model.get_text_features(**proc.tokenizer(TEXTS, padding="max_length", truncation=True,
                                                         return_tensors="pt")).pooler_output.numpy()
        ref_i = model.get_image_features(**proc.image_processor(pils, return_tensors="pt")).pooler_output.numpy()
    ours_t = engine.run_sync(EmbedRequest(texts=TEXTS)).vectors
    each_t = np.stack([r.vectors[0] for r in serve(engine, [EmbedRequest(texts=[t]) for t in TEXTS])])
    ours_i = engine.run_sync(EmbedRequest(modality="image", inputs=[data_uri(b, "image/png") for b in IMAGES])).vectors
    assert cosine(ours_t, ref_t).min() >= COS and cosine(each_t, ref_t).min() >= COS
    assert cosine(ours_i, ref_i).min() >= COS
    assert engine.run_sync(EmbedRequest(texts=["red"])).prompt_tokens < 16  # usage counts real tokens


# CLAP -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clap(clap_dir):
    from transformers import AutoProcessor, ClapModel

    return _engine(clap_dir), ClapModel.from_pretrained(clap_dir).eval(), AutoProcessor.from_pretrained(clap_dir)


def test_clap_reads_its_feature_extractor_settings(clap):
    engine, _, proc = clap
    card = engine.describe()
    assert card["modalities"] == ["text", "audio"]
    assert card["sampling_rate"] == proc.feature_extractor.sampling_rate == 16000
    assert card["truncation"] == proc.feature_extractor.truncation == "rand_trunc"


def test_clap_text_single_and_batched(clap):
    engine, model, proc = clap
    with torch.inference_mode():
        single = np.stack([model.get_text_features(**proc.tokenizer([t], return_tensors="pt")).pooler_output[0]
                           for t in TEXTS])
    ours = engine.run_sync(EmbedRequest(texts=TEXTS)).vectors
    each = np.stack([r.vectors[0] for r in serve(engine, [EmbedRequest(texts=[t]) for t in TEXTS])])
    assert cosine(ours, single).min() >= COS and cosine(each, single).min() >= COS


def test_clap_audio_single_and_batched(clap):
    import soundfile as sf

    engine, model, proc = clap
    clips = [audio_bytes(sine(f, s), 16000, "WAV", "FLOAT") for f, s in ((440, 0.3), (880, 0.6), (220, 0.95))]
    clips.append(audio_bytes(sine(660, 0.5), 16000, "FLAC"))
    waves = [sf.read(io.BytesIO(c), dtype="float32")[0] for c in clips]
    with torch.inference_mode():
        single = np.stack([
            model.get_audio_features(**proc.feature_extractor([w], sampling_rate=16000, return_tensors="pt")).pooler_output[0]
            for w in waves
        ])
    mimes = ["audio/wav"] * 3 + ["audio/flac"]
    uris = [data_uri(c, m) for c, m in zip(clips, mimes)]
    ours = engine.run_sync(EmbedRequest(modality="audio", inputs=uris)).vectors
    each = np.stack([r.vectors[0] for r in serve(engine, [EmbedRequest(modality="audio", inputs=[u]) for u in uris])])
    assert cosine(ours, single).min() >= COS and cosine(each, single).min() >= COS


# ColPali --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def colpali(colpali_dir):
    from transformers import AutoProcessor, ColPaliForRetrieval

    return (_engine(colpali_dir), ColPaliForRetrieval.from_pretrained(colpali_dir).eval(),
            AutoProcessor.from_pretrained(colpali_dir))


def maxsim(query: np.ndarray, page: np.ndarray) -> float:
    return float((query @ page.T).max(axis=1).sum())


def test_colpali_queries_and_pages_multi_vector_parity(colpali):
    engine, model, proc = colpali
    queries = ["red circle", "a dog photo of the green square"]
    pils = [_pil(b) for b in IMAGES]
    with torch.inference_mode():
        ref_q = [model(**proc.process_queries([q])).embeddings[0].numpy() for q in queries]
        ref_p = [model(**proc.process_images([p])).embeddings[0].numpy() for p in pils]
    ours_q = engine.run_sync(EmbedRequest(texts=queries)).vectors  # one batch, right-padded
    each_q = [r.vectors[0] for r in serve(engine, [EmbedRequest(texts=[q]) for q in queries])]
    uris = [data_uri(b, "image/png") for b in IMAGES]
    ours_p = engine.run_sync(EmbedRequest(modality="image", inputs=uris)).vectors
    for ours, ref in [*zip(ours_q, ref_q), *zip(each_q, ref_q), *zip(ours_p, ref_p)]:
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        assert cosine(ours, ref).min() >= COS
    assert ours_q[0].shape[0] != ours_q[1].shape[0]  # variable-length queries
    ours_scores = np.array([[maxsim(q, p) for p in ours_p] for q in ours_q])
    ref_scores = np.array([[maxsim(q, p) for p in ref_p] for q in ref_q])
    assert np.allclose(ours_scores, ref_scores, atol=1e-3)
    assert (ours_scores.argmax(axis=1) == ref_scores.argmax(axis=1)).all()
    with pytest.raises(InvalidInput, match="multi-vector"):
        engine.run_sync(EmbedRequest(texts=queries, dimensions=4))


def test_clap_fusion_extractor_on_an_unfused_model_uses_rand_trunc(clap_dir, tmp_path):
    import json
    import shutil

    folder = tmp_path / "clap-fusion-config"
    shutil.copytree(clap_dir, folder)
    cfg = json.loads((folder / "processor_config.json").read_text())
    cfg["feature_extractor"]["truncation"] = "fusion"
    (folder / "processor_config.json").write_text(json.dumps(cfg))
    engine = _engine(folder)
    assert engine.describe()["truncation"] == "rand_trunc"
    uri = data_uri(audio_bytes(sine(440, 0.5), 16000), "audio/wav")
    assert engine.run_sync(EmbedRequest(modality="audio", inputs=[uri])).vectors.shape == (1, 16)
