"""A real server on 127.0.0.1 serving tiny CLIP, CLAP, ColPali and MiniLM; media as data URIs and as URLs
of a loopback HTTP server (opened through ``TESSERA_MEDIA_ALLOW``); real clients (httpx, openai)."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import pytest
import torch

from tests.multimodal.media_support import Route, audio_bytes, data_uri, png, sine
from tests.support.server import running_server

COS = 0.9999
RED = png((40, 30), (255, 0, 0), shape="circle")
GREEN = png((64, 48), (0, 200, 0), shape="square")
TONE = audio_bytes(sine(440, 0.5), 16000, "WAV", "FLOAT")
CHIRP = audio_bytes(sine(880, 0.7), 16000, "FLAC")


def cosine(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def server(clip_dir, clap_dir, colpali_dir, minilm_dir, media_server):
    models = [
        {"path": str(clip_dir), "name": "tiny-clip"},
        {"path": str(clap_dir), "name": "tiny-clap"},
        {"path": str(colpali_dir), "name": "tiny-colpali"},
        {"path": str(minilm_dir), "name": "minilm"},
    ]
    env = {
        "TESSERA_MODELS": json.dumps(models),
        "TESSERA_MEDIA_ALLOW": '["127.0.0.1/32"]',
        "TESSERA_MEDIA_FETCH_TIMEOUT_S": "1",
        "TESSERA_MEDIA_MAX_BYTES": "100000",
        "TESSERA_THREADS": "1",
    }
    with running_server(env) as base:
        yield base


def embed(base: str, **body) -> httpx.Response:
    return httpx.post(base + "/v1/embeddings", json=body, timeout=30)


def vectors(response: httpx.Response) -> list:
    assert response.status_code == 200, response.text
    return [d["embedding"] for d in response.json()["data"]]


def _pil(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def test_models_report_modalities(server):
    cards = {c["id"]: c for c in httpx.get(server + "/v1/models").json()["data"]}
    assert cards["tiny-clip"]["modalities"] == ["text", "image"]
    assert cards["tiny-clap"]["modalities"] == ["text", "audio"]
    assert cards["tiny-colpali"]["modalities"] == ["text", "image"] and cards["tiny-colpali"]["multi_vector"]
    assert cards["minilm"]["modalities"] == ["text"]


def test_clip_images_from_data_uris_and_urls_match_the_reference(server, clip_dir, media_server):
    from transformers import AutoProcessor, CLIPModel

    url = media_server.add("/api/green.png", Route(GREEN, "image/png"))
    got = vectors(embed(server, model="tiny-clip", modality="image", input=[data_uri(RED, "image/png"), url]))
    text = vectors(embed(server, model="tiny-clip", input=["a red circle", "green square"]))
    model, proc = CLIPModel.from_pretrained(clip_dir).eval(), AutoProcessor.from_pretrained(clip_dir)
    with torch.inference_mode():
        ref_img = model.get_image_features(**proc.image_processor([_pil(RED), _pil(GREEN)], return_tensors="pt"))
        ref_txt = model.get_text_features(**proc.tokenizer(["a red circle", "green square"], padding=True,
                                                           return_tensors="pt"))
    assert cosine(got, ref_img.pooler_output.numpy()).min() >= COS
    assert cosine(text, ref_txt.pooler_output.numpy()).min() >= COS
    assert ("/api/green.png", f"127.0.0.1:{media_server.port}") in media_server.requests


def test_openai_client_image_embeddings(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    uri = data_uri(RED, "image/png")
    # the client asks for base64 by default and decodes it itself
    out = client.embeddings.create(model="tiny-clip", input=[uri, uri], extra_body={"modality": "image"})
    assert len(out.data) == 2 and len(out.data[0].embedding) == 16
    direct = vectors(embed(server, model="tiny-clip", modality="image", input=uri))
    assert np.allclose(out.data[0].embedding, direct[0], atol=1e-6)
    assert out.usage.prompt_tokens == 2 * ((32 // 8) ** 2 + 1)


def test_infinity_client_image_and_audio_embeddings(server, media_server):
    """What ``infinity_client`` calls for media: POST /embeddings_image and /embeddings_audio, the same
    vectors as /v1/embeddings with the modality."""
    from infinity_client import Client
    from infinity_client.api.default import embeddings_audio, embeddings_image
    from infinity_client.models import AudioEmbeddingInput, ImageEmbeddingInput

    client = Client(base_url=server, raise_on_unexpected_status=True)
    images = [data_uri(RED, "image/png"), media_server.add("/api/green-inf.png", Route(GREEN, "image/png"))]
    got = embeddings_image.sync(client=client, body=ImageEmbeddingInput(input_=images, model="tiny-clip"))
    direct = vectors(embed(server, model="tiny-clip", modality="image", input=images))
    np.testing.assert_allclose([d.embedding for d in got.data], direct, atol=1e-6)
    assert got.model == "tiny-clip" and got.usage.prompt_tokens > 0
    sounds = [data_uri(CHIRP, "audio/flac")]
    heard = embeddings_audio.sync(client=client, body=AudioEmbeddingInput(input_=sounds, model="tiny-clap"))
    np.testing.assert_allclose([d.embedding for d in heard.data],
                               vectors(embed(server, model="tiny-clap", modality="audio", input=sounds)), atol=1e-6)
    refused = httpx.post(server + "/embeddings_image", json={"input": ["not a uri"], "model": "tiny-clip"}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"].startswith("input")


def test_clap_audio_from_url_and_data_uri_matches_the_reference(server, clap_dir, media_server):
    import soundfile as sf
    from transformers import AutoProcessor, ClapModel

    url = media_server.add("/api/tone.wav", Route(TONE, "audio/wav"))
    got = vectors(embed(server, model="tiny-clap", modality="audio", input=[url, data_uri(CHIRP, "audio/flac")]))
    model, proc = ClapModel.from_pretrained(clap_dir).eval(), AutoProcessor.from_pretrained(clap_dir)
    waves = [sf.read(io.BytesIO(b), dtype="float32")[0] for b in (TONE, CHIRP)]
    with torch.inference_mode():
        ref = [model.get_audio_features(**proc.feature_extractor([w], sampling_rate=16000, return_tensors="pt"))
               .pooler_output[0].numpy() for w in waves]
    assert cosine(got, np.stack(ref)).min() >= COS


def test_colpali_multi_vector_float_and_base64(server, colpali_dir):
    from transformers import AutoProcessor, ColPaliForRetrieval

    pages = [data_uri(RED, "image/png"), data_uri(GREEN, "image/png")]
    page_vecs = [np.asarray(v, np.float32) for v in vectors(embed(server, model="tiny-colpali", modality="image",
                                                                   input=pages))]
    b64 = vectors(embed(server, model="tiny-colpali", modality="image", input=pages, encoding_format="base64"))
    decoded = [np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in item]) for item in b64]
    for a, b in zip(page_vecs, decoded):
        assert a.shape == b.shape and np.allclose(a, b, atol=1e-6)
    query_vecs = [np.asarray(v, np.float32) for v in vectors(embed(server, model="tiny-colpali",
                                                                    input=["red circle", "green"]))]
    model, proc = ColPaliForRetrieval.from_pretrained(colpali_dir).eval(), AutoProcessor.from_pretrained(colpali_dir)
    with torch.inference_mode():
        ref_p = [model(**proc.process_images([_pil(b)])).embeddings[0].numpy() for b in (RED, GREEN)]
        ref_q = [model(**proc.process_queries([q])).embeddings[0].numpy() for q in ("red circle", "green")]
    for ours, ref in [*zip(page_vecs, ref_p), *zip(query_vecs, ref_q)]:
        assert ours.shape == ref.shape and cosine(ours, ref).min() >= COS
    scores = np.array([[(q @ p.T).max(1).sum() for p in page_vecs] for q in query_vecs])
    ref_scores = np.array([[(q @ p.T).max(1).sum() for p in ref_p] for q in ref_q])
    assert np.allclose(scores, ref_scores, atol=1e-3)


def _error(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body["message"]


def test_wrong_modality_names_the_models_modalities(server):
    message = _error(embed(server, model="minilm", modality="image", input=data_uri(RED, "image/png")))
    assert "modalities: ['text']" in message
    message = _error(embed(server, model="tiny-clap", modality="image", input=data_uri(RED, "image/png")))
    assert "modalities: ['text', 'audio']" in message
    _error(embed(server, model="tiny-clip", modality="video", input="x"), 422)
    assert "input[0]" in _error(embed(server, model="tiny-clip", modality="image", input=[[1, 2, 3]]))


@pytest.mark.parametrize("make, fragment", [
    (lambda s: [data_uri(RED, "image/png"), "data:image/png;base64,@@@"], "input[1]: data: URI is not valid base64"),
    (lambda s: [data_uri(RED, "image/png"), data_uri(b"hello", "image/png")], "input[1]: cannot decode the image"),
    (lambda s: ["file:///etc/passwd"], "input[0]: unsupported media reference"),
    (lambda s: [f"http://127.0.0.2:{s.port}/x.png"], "input[0]: refused to fetch from '127.0.0.2': it resolves to loopback"),
    (lambda s: [f"http://[::1]:{s.port}/x.png"], "input[0]: refused to fetch from '::1': it resolves to loopback"),
    (lambda s: [f"http://0.0.0.0:{s.port}/x.png"], "input[0]: refused to fetch from '0.0.0.0': it resolves to unspecified"),
    (lambda s: [data_uri(RED, "image/png"), s.add("/api/page.html", Route(b"<html>", "text/html"))],
     "input[1]: the URL's content type 'text/html'"),
    (lambda s: [s.add("/api/huge.png", Route(b"x" * 200_000, "image/png"))], "input[0]: media exceeds 100000 bytes"),
    (lambda s: [s.add("/api/missing.png", Route(b"no", "text/plain", 404))], "input[0]: the URL answered HTTP 404"),
    (lambda s: [data_uri(RED, "image/png"), data_uri(RED, "image/png"),
                s.add("/api/slow.png", Route(RED, "image/png", delay_s=4.0))],
     "input[2]: fetching took longer than 1s"),
])
def test_bad_media_is_a_400_naming_the_item(server, media_server, make, fragment):
    refs = make(media_server)
    before = len(media_server.requests)
    started = time.monotonic()
    message = _error(embed(server, model="tiny-clip", modality="image", input=refs))
    assert fragment in message
    assert time.monotonic() - started < 3.0
    if "refused" in fragment:
        assert len(media_server.requests) == before  # refused before any connection


def test_request_timeout_header_bounds_media_fetching(server, media_server):
    url = media_server.add("/api/slow-header.png", Route(RED, "image/png", delay_s=4.0))
    started = time.monotonic()
    response = httpx.post(server + "/v1/embeddings", headers={"X-Request-Timeout": "0.4"}, timeout=30,
                          json={"model": "tiny-clip", "modality": "image", "input": [url, url, url]})
    assert "the request's deadline passed while fetching input[0]" in _error(response, 504)
    assert time.monotonic() - started < 1.5


def test_text_models_are_unchanged_by_the_modality_field(server, st_minilm):
    got = vectors(embed(server, model="minilm", input=["a red circle", "a dog"]))
    explicit = vectors(embed(server, model="minilm", input=["a red circle", "a dog"], modality="text"))
    ref = st_minilm.encode(["a red circle", "a dog"])
    assert cosine(got, ref).min() >= COS and np.allclose(got, explicit)
