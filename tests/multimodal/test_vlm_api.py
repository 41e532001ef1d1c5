"""``messages`` on ``/v1/embeddings`` (vision–language embedders, tests/parity/test_vlm_embed_parity.py for the
numbers): images through the same media loading as every multi-modal model (data: URIs, http(s) URLs with the
guard), and every bad or hostile request answered in the API's error format — 400 for a wrong shape or a model
that takes no such input, 413 past a limit, image tokens included — before any inference."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.config import ModelSpec, Settings
from tests.api.conftest import assert_error
from tests.multimodal.media_support import Route, data_uri, png
from tests.support import vlm_models

SMALL = png((60, 40), (200, 30, 30))
BIG = png((400, 300), (30, 200, 30))  # 120 000 pixels: over this server's media_max_pixels


@pytest.fixture(scope="module")
def client(minilm_dir):
    folder = vlm_models.gme_folder()
    settings = Settings(models=[ModelSpec(path=folder, name="gme"), ModelSpec(path=folder, name="gme-short",
                                                                                  max_length=60),
                                ModelSpec(path=minilm_dir, name="minilm")],
                        threads=2, max_items_per_request=4, max_chars_per_item=300, media_max_pixels=100_000,
                        max_tokens_per_request=90, media_allow=["127.0.0.1/32"])
    with TestClient(create_app(settings)) as c:
        yield c


def _image(uri: str) -> dict:
    return {"type": "image_url", "image_url": {"url": uri}}


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def _post(client, **body):
    return client.post("/v1/embeddings", json={"model": "gme", **body})


def test_images_by_url_and_by_data_uri_give_one_vector(client, media_server):
    url = media_server.add("/vlm/small.png", Route(SMALL, "image/png"))
    text = {"type": "text", "text": "a red square"}
    by_url = _post(client, messages=_user(_image(url), text))
    by_uri = _post(client, messages=_user(_image(data_uri(SMALL, "image/png")), text))
    assert by_url.status_code == 200 and by_uri.status_code == 200, (by_url.text, by_uri.text)
    a, b = (np.asarray(r.json()["data"][0]["embedding"]) for r in (by_url, by_uri))
    assert float(a @ b) > 0.99999
    assert ("/vlm/small.png", f"127.0.0.1:{media_server.port}") in media_server.requests
    usage = by_url.json()["usage"]["prompt_tokens"]  # the image's tokens count: 60×40 px → at least 4 tokens
    text_only = _post(client, messages=_user({"type": "text", "text": "a red square"})).json()["usage"]["prompt_tokens"]
    assert usage >= text_only + 4 + 2  # + <|vision_start|>, <|vision_end|>


@pytest.mark.parametrize("body,status,code,says", [
    ({"input": "x", "messages": _user({"type": "text", "text": "x"})}, 400, "invalid_input", "exactly one of"),
    ({}, 400, "invalid_input", "exactly one of"),
    ({"messages": []}, 400, "invalid_input", "non-empty list"),
    ({"messages": ["hello"]}, 400, "invalid_input", "messages[0] must be an object"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_input", "messages[0].role"),
    ({"messages": [{"role": "user", "content": []}]}, 400, "invalid_input", "non-empty list of parts"),
    ({"messages": _user({"type": "video_url", "video_url": {"url": "x"}})}, 400, "invalid_input",
     "got type 'video_url'"),
    ({"messages": _user({"type": "image_url", "image_url": "data:image/png;base64,AAAA"})}, 400, "invalid_input",
     "an image_url part is"),
    ({"messages": _user({"type": "text", "text": 5})}, 400, "invalid_input", "content[0]"),
    ({"messages": _user({"type": "text", "text": "see <|image_pad|> here"})}, 400, "invalid_input", "placeholder"),
    ({"messages": _user({"type": "text", "text": "x"}), "add_generation_prompt": True, "continue_final_message": True},
     400, "invalid_input", "cannot both be true"),
    ({"messages": _user({"type": "text", "text": "x"}), "modality": "image"}, 400, "invalid_input", "'modality'"),
    ({"messages": _user({"type": "text", "text": "x"}), "prompt": "Find it."}, 400, "invalid_input",
     "'prompt' does not apply to 'messages'"),
    ({"input": "x", "modality": "audio"}, 400, "invalid_input", "its modalities: ['text', 'image']"),
    ({"input": [[5, 6, 7]]}, 400, "invalid_input", "token-id input"),
    ({"input": "x", "dimensions": 65}, 400, "invalid_input", "exceeds the model's dimension 64"),
    ({"messages": _user(_image("data:image/png;base64,not base64!"))}, 400, "invalid_media", "input[0]"),
    ({"messages": _user(_image("file:///etc/passwd"))}, 400, "invalid_media", "unsupported media reference"),
    ({"messages": _user(_image("http://169.254.169.254/latest/meta-data"))}, 400, "invalid_media", "link-local"),
    ({"messages": _user(_image(data_uri(BIG, "image/png")))}, 400, "invalid_media", "pixels"),
    ({"messages": _user(*[_image(data_uri(SMALL, "image/png"))] * 5)}, 413, None, "5 inputs in one request"),
    ({"messages": _user({"type": "text", "text": "y" * 301})}, 413, None, "301 characters of text"),
    # four small images (16 tokens each) and text: over this server's 90 tokens per request
    ({"messages": _user(*[_image(data_uri(png((112, 112)), "image/png"))] * 4, {"type": "text", "text": "x"})},
     413, "too_many_tokens", "tokens; the limit is 90"),
])
def test_bad_and_hostile_requests_are_refused_in_the_error_format(client, body, status, code, says):
    response = _post(client, **body)
    assert_error(response, status, code)
    assert says in response.json()["error"]["message"], response.json()


def test_a_conversation_over_the_models_length_is_refused_not_cut(client):
    image = _image(data_uri(png((112, 112)), "image/png"))  # 16 image tokens + 2 markers, + the template's ~30
    assert _post(client, model="gme-short", messages=_user(image)).status_code == 200
    response = _post(client, model="gme-short", messages=_user(image, image))
    assert_error(response, 413)
    assert "the model's limit is 60" in response.json()["error"]["message"]
    assert "read at its last token" in response.json()["error"]["message"]


def test_text_models_refuse_messages_and_images(client):
    response = client.post("/v1/embeddings", json={"model": "minilm", "messages": _user({"type": "text", "text": "x"})})
    assert_error(response, 400, "invalid_input")
    assert "vision–language embedders" in response.json()["error"]["message"]
    response = client.post("/v1/embeddings", json={"model": "minilm", "modality": "image",
                                                   "input": [data_uri(SMALL, "image/png")]})
    assert_error(response, 400)
    assert "its modalities: ['text']" in response.json()["error"]["message"]
