"""Bad bytes and loose types never cost a 500 or a silently different answer: lone surrogates, token ids
past int64, bodies that are not parseable JSON, and values that only coercion would make valid. Each
answer is a 4xx in the error shape naming what is wrong, and the app keeps serving."""

from __future__ import annotations

import gzip

import pytest

from tests.api.conftest import assert_error, client_for
from tests.support.tokenizer_work import counting_tokenizer

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(minilm_dir, reranker_dir, classifier_dir, splade_dir, colbert_dir):
    models = [
        {"path": str(minilm_dir), "name": "minilm", "backend": "torch"},
        {"path": str(reranker_dir), "name": "reranker", "backend": "torch"},
        {"path": str(classifier_dir), "name": "classifier", "backend": "torch"},
        {"path": str(splade_dir), "name": "splade", "backend": "torch"},
        {"path": str(colbert_dir), "name": "colbert", "backend": "torch"},
    ]
    with client_for(models=models) as c:
        yield c


def _still_serving(client):
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": "still here"})
    assert response.status_code == 200, response.text


LONE = "a\\ud800b"  # a JSON escape of a lone surrogate: valid JSON syntax, not valid Unicode text

SURROGATE_BODIES = [
    ("/v1/embeddings", f'{{"model": "minilm", "input": "{LONE}"}}', "input[0]"),
    ("/v1/embeddings", f'{{"model": "minilm", "input": ["ok", "{LONE}"]}}', "input[1]"),
    ("/v1/embeddings", f'{{"model": "minilm", "input": "x", "prompt": "{LONE}"}}', "prompt[0]"),
    ("/v1/embeddings/sparse", f'{{"model": "splade", "input": "{LONE}"}}', "input[0]"),
    ("/v1/rerank", f'{{"model": "reranker", "query": "{LONE}", "documents": ["a"]}}', "query[0]"),
    ("/v1/rerank", f'{{"model": "reranker", "query": "q", "documents": ["a", "{LONE}"]}}', "documents[1]"),
    ("/v2/rerank", f'{{"model": "reranker", "query": "q", "documents": ["{LONE}"]}}', "documents[0]"),
    ("/v1/classify", f'{{"model": "classifier", "input": ["{LONE}"]}}', "input[0]"),
    ("/v1/score", f'{{"model": "colbert", "query": "{LONE}", "documents": ["a"]}}', "input[0]"),
    ("/v1/tokenize", f'{{"model": "minilm", "input": "{LONE}"}}', "input[0]"),
]


@pytest.mark.parametrize("path, body, where", SURROGATE_BODIES)
def test_a_lone_surrogate_is_a_400_on_every_text_route(client, path, body, where):
    response = client.post(path, content=body.encode(), headers=JSON)
    assert_error(response, 400, "invalid_text")
    assert where in response.json()["error"]["message"]
    _still_serving(client)


def test_tei_embed_surrogate(minilm_dir):
    """TEI's /embed carries no model field: a one-model app serves it."""
    with client_for(models=[{"path": str(minilm_dir), "name": "minilm", "backend": "torch"}]) as one:
        response = one.post("/embed", content=f'{{"inputs": "{LONE}"}}'.encode(), headers=JSON)
        assert_error(response, 400, "invalid_text")


@pytest.mark.parametrize("ids", ["[101, 9223372036854775808, 102]", "[18446744073709551615]", "[-1]", "[30522]"])
def test_token_ids_outside_the_vocabulary_are_400(client, ids):
    response = client.post("/v1/embeddings", content=f'{{"model": "minilm", "input": [{ids}]}}'.encode(),
                           headers=JSON)
    assert_error(response, 400, "invalid_token_id")
    _still_serving(client)


@pytest.mark.parametrize("name, body, headers", [
    ("invalid UTF-8", b'{"input": "\xff\xfe"}', JSON),
    ("5000-digit integer", b'{"input": ' + b"9" * 5000 + b"}", JSON),
    ("nesting past the recursion limit", b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON),
    ("gzip body", gzip.compress(b'{"input": "hello"}'), {**JSON, "content-encoding": "gzip"}),
    ("truncated JSON", b'{"input": "hel', JSON),
])
def test_bodies_that_do_not_parse_are_invalid_json_400(client, name, body, headers):
    response = client.post("/v1/embeddings", content=body, headers=headers)
    assert_error(response, 400, "invalid_json")
    assert response.json()["error"]["type"] == "invalid_request_error"
    _still_serving(client)


def test_nesting_that_parses_is_a_schema_error_not_a_500(client):
    response = client.post("/v1/embeddings", content=b'{"input": ' + b"[" * 900 + b"]" * 900 + b"}", headers=JSON)
    assert response.status_code in (400, 422), response.text
    _still_serving(client)


def test_a_body_is_parsed_once_even_when_it_does_not_validate(client, monkeypatch):
    """A body orjson read and that failed validation went to FastAPI, which parsed it again with json.loads
    (1.3 s of the 3.6 s a deep 8 MB body cost): the validation error is now answered from the one parse, with
    the errors FastAPI's validation gives. Python's reader runs only for what orjson does not read."""
    from starlette.requests import Request

    reads: list[str] = []
    real = Request.json

    async def counted(request):  # FastAPI's reading of a JSON body (json.loads), counted
        reads.append(request.url.path)
        return await real(request)

    monkeypatch.setattr(Request, "json", counted)
    invalid = [{"model": "minilm", "input": "x", "dimensions": "8"}, {"model": "minilm", "input": [[1, "a"]]},
               {"model": "minilm"} | {"input": [{"nested": [[]]}]}]
    for body in invalid:
        response = client.post("/v1/embeddings", json=body)
        assert_error(response, 422, "validation_error")
    response = client.post("/v1/embeddings", content=b'["a", "list"]', headers=JSON)
    assert_error(response, 422, "validation_error")
    assert reads == []
    response = client.post("/v1/embeddings", content=f'{{"model": "minilm", "input": "{LONE}"}}'.encode(), headers=JSON)
    assert_error(response, 400, "invalid_text")  # orjson refuses a lone surrogate: Python's reader, once
    assert len(reads) == 1


def test_nesting_past_the_bound_is_refused_before_parsing(client):
    """No request nests deeper than 64 levels (the body's object is the first); brackets inside strings are not
    nesting."""
    response = client.post("/v1/embeddings", content=b'{"input": ' + b"[" * 64 + b'"x"' + b"]" * 64 + b"}",
                           headers=JSON)
    assert_error(response, 400, "invalid_json")
    assert "64 levels" in response.json()["error"]["message"]
    response = client.post("/v1/embeddings", content=b'{"input": ' + b"[" * 63 + b'"x"' + b"]" * 63 + b"}",
                           headers=JSON)
    assert_error(response, 422, "validation_error")  # within the bound: the schema's error
    texts = ["[" * 200 + '\\"' + "{" * 200, '"]]' * 100 + "\\"]
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": texts})
    assert response.status_code == 200, response.text
    _still_serving(client)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": True}, "dimensions"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": "32"}, "dimensions"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "normalize": "yes"}, "normalize"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "truncate": 0}, "truncate"),
    ("/v1/embeddings", {"model": "minilm", "input": [True, False]}, "input"),
    ("/v1/embeddings", {"model": "minilm", "input": [[101, 2.5, 102]]}, "input"),
    ("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["a"], "top_n": "1"}, "top_n"),
    ("/v1/classify", {"model": "classifier", "input": "x", "raw_scores": "true"}, "raw_scores"),
])
def test_values_are_not_coerced(client, path, body, param):
    response = client.post(path, json=body)
    assert_error(response, 422, "validation_error")
    assert response.json()["error"]["param"].startswith(param)


def test_correctly_typed_values_still_work(client):
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": [[101, 7592, 102]], "dimensions": 32,
                                                   "normalize": True, "truncate": True})
    assert response.status_code == 200 and len(response.json()["data"][0]["embedding"]) == 32


def test_a_huge_prompt_counts_toward_the_character_limits(client):
    """{"input": ["x"] * 2048, "prompt": "word " * 40000} (a 210 KB body) drove a server to 14 GB and past 120 s."""
    import time

    started = time.monotonic()
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": ["x"] * 2048, "prompt": "word " * 40000})
    assert_error(response, 413)
    assert response.json()["error"]["param"] == "prompt"
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": ["x"] * 256, "prompt": "word " * 19000})
    assert_error(response, 413)  # each item fits, the request does not: 256 × 95k characters
    assert time.monotonic() - started < 2.0
    _still_serving(client)


def test_a_prompt_longer_than_the_window_is_tokenized_once_with_the_same_tokens(client, minilm_dir):
    """Allowed: a 60k-character prompt over 64 texts. Every text's window is the prompt's first tokens,
    exactly as when each prompt + text is tokenized whole (checked here against the tokenizer itself).
    The work is counted, not timed: the characters handed to the tokenizer stay a few prompts' worth
    (once per text was 64 prompts' worth), however busy the machine is."""
    from core.tokenization import TextTokenizer

    from core.tasks.embed import EmbedRequest

    prompt, texts = "word " * 12_000, [f"text {i}" for i in range(64)]
    task = client.app.state.registry.engines["minilm"].task
    with counting_tokenizer(task.tokenizer) as work:
        items = task.prepare(EmbedRequest(texts=texts, prompt=prompt))
    assert len(items) == 64
    assert not any(t.startswith(prompt) and t != prompt for t in work.texts), "the prompt was tokenized with a text"
    assert work.chars <= 4 * len(prompt), f"{work.chars} characters tokenized for a {len(prompt)}-character prompt"
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": texts, "prompt": prompt})
    assert response.status_code == 200, response.text
    tokenizer = TextTokenizer(minilm_dir, 256)
    whole = tokenizer.encode([prompt + texts[0], prompt + texts[-1]])
    assert (whole[0].ids == whole[1].ids).all() and response.json()["usage"]["prompt_tokens"] == 64 * whole[0].cost
    vectors = [d["embedding"] for d in response.json()["data"]]
    assert vectors[0] == vectors[-1]
    refused = client.post("/v1/embeddings", json={"model": "minilm", "input": texts, "prompt": prompt, "truncate": False})
    assert_error(refused, 413, "input_too_long")


@pytest.mark.parametrize("keys", ['["k", ""]', '["  "]', '[""]'])
def test_an_empty_api_key_is_a_start_up_error(keys, monkeypatch):
    """'["$KEY"]' with KEY unset used to switch authentication off for requests without credentials."""
    from pydantic import ValidationError

    from core.config import Settings

    monkeypatch.setenv("TESSERA_API_KEYS", keys)
    with pytest.raises(ValidationError, match=r"api_keys\[\d\] is empty or blank"):
        Settings()


def test_tokenize_has_the_limits_of_the_other_routes(minilm_dir):
    """/v1/tokenize with an 8.3 MB body reached 1.9 GB and ran on after the client left: it now stops at
    the tokens-per-request limit (413) and at the deadline (504), like the other routes. The refusal is
    checked by the work done (the texts tokenized before it), not by a time that a busy machine stretches."""
    texts = ["word " * 20_000] * 80  # 8 MB, 1.6M tokens
    with client_for(models=[{"path": str(minilm_dir), "name": "m", "backend": "torch"}],
                    max_request_bytes=16 << 20) as one:
        tokenizer = one.app.state.registry.engines["m"].task.tokenizer
        limit = one.app.state.settings.max_tokens_per_request
        for path, key in (("/v1/tokenize", "input"), ("/tokenize", "inputs")):
            with counting_tokenizer(tokenizer) as work:
                response = one.post(path, json={key: texts})
            assert_error(response, 413, "too_many_tokens")
            # stopped once the running total passed the limit: not every text was tokenized
            assert 0 < len(work.texts) < len(texts), f"{len(work.texts)} of {len(texts)} texts tokenized before the 413"
            assert work.chars < 3 * limit * len("word "), f"{work.chars} characters tokenized before the 413"
        response = one.post("/v1/tokenize", json={"input": ["word " * 20_000] * 12},
                            headers={"X-Request-Timeout": "0.05"})
        assert_error(response, 504)
        assert one.post("/v1/tokenize", json={"input": "fine"}).json()["data"][0]["count"] == 3


def test_a_multi_vector_answer_is_bounded_by_the_response_limit(colbert_dir):
    """A vector per token: the answer grows with the tokens, so it is counted (values × 8 bytes, low)
    against max_response_bytes before any inference; a score request answers one number per document."""
    with client_for(models=[{"path": str(colbert_dir), "name": "colbert", "backend": "torch"}],
                    max_response_bytes=20_000) as c:
        ok = c.post("/v1/embeddings", json={"model": "colbert", "input": ["a short text"]})
        assert ok.status_code == 200, ok.text
        refused = c.post("/v1/embeddings", json={"model": "colbert", "input": ["word " * 200] * 8})
        assert refused.status_code == 413, refused.text[:300]  # 8 texts × 64 tokens × 16 values: 65 KB at least
        assert_error(refused, 413, "response_too_large")
        assert "max_response_bytes" in refused.json()["error"]["message"]
        scored = c.post("/v1/score", json={"model": "colbert", "query": "q", "documents": ["word " * 200] * 4})
        assert scored.status_code == 200, scored.text


# ---- image shapes ------------------------------------------------------------------------------------------

def _strip_png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, "PNG", optimize=True)
    return buf.getvalue()


@pytest.mark.parametrize("size", [{"shortest_edge": 448}, {"shortest_edge": 224, "longest_edge": 1000},
                                  {"height": 384, "width": 384}, {"max_height": 300, "max_width": 500}])
def test_the_size_after_the_processors_resize_is_what_the_processor_makes(size):
    """core.media.processor_resize predicts the resize of transformers' own image processors (CLIP's,
    SigLIP's classes), from the header, for what the pixel bound checks before any resize."""
    from PIL import Image
    from transformers import CLIPImageProcessorPil

    from core.media import processor_resize

    processor = CLIPImageProcessorPil(size=size, do_center_crop=False)
    resize = processor_resize(processor.size)
    for width, height in [(640, 480), (37, 1000), (1000, 5), (224, 224)]:
        out = processor(Image.new("RGB", (width, height)), return_tensors="np", do_normalize=False,
                        do_rescale=False)["pixel_values"][0]
        assert resize(width, height) == (out.shape[-1], out.shape[-2]), (size, width, height)


def test_an_image_the_processor_would_blow_up_is_refused_before_decoding():
    """180x1 is within the aspect bound; a processor that scales its shortest side to 448 would make it
    448 x 80,640 (36M pixels, past the 25M limit): refused from the header."""
    import base64

    from transformers import CLIPImageProcessorPil

    from core.errors import InvalidInput
    from core.media import MediaFetcher, MediaLimits, processor_resize

    resize = processor_resize(CLIPImageProcessorPil(size={"shortest_edge": 448}).size)
    fetcher = MediaFetcher(MediaLimits())
    uri = "data:image/png;base64," + base64.b64encode(_strip_png(180, 1)).decode()
    with pytest.raises(InvalidInput, match=r"input\[0\].*resizes to 80640x448") as refused:
        fetcher.image(uri, index=0, resized=resize)
    assert refused.value.code == "invalid_media"
    small = "data:image/png;base64," + base64.b64encode(_strip_png(60, 40)).decode()
    assert fetcher.image(small, index=0, resized=resize).size == (60, 40)


@pytest.fixture(scope="module")
def vlm():
    from fastapi.testclient import TestClient

    from core.api.app import create_app
    from core.config import ModelSpec, Settings
    from tests.support import vlm_models

    settings = Settings(models=[ModelSpec(path=vlm_models.gme_folder(), name="gme")], threads=2)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.mark.parametrize("width, height", [(600, 2), (2, 600), (5_000, 1)])
def test_a_vlm_image_past_its_processors_aspect_ratio_is_a_400(vlm, width, height):
    """Qwen2-VL's smart_resize refuses an aspect ratio over 200 with a ValueError: that was a 500."""
    import base64

    uri = "data:image/png;base64," + base64.b64encode(_strip_png(width, height)).decode()
    for body in ({"model": "gme", "modality": "image", "input": [uri]},
                 {"model": "gme", "messages": [{"role": "user", "content": [
                     {"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "what"}]}]}):
        response = vlm.post("/v1/embeddings", json=body)
        assert_error(response, 400, "invalid_media")
        assert "aspect ratio" in response.json()["error"]["message"]
    assert vlm.post("/v1/embeddings", json={"model": "gme", "input": "still here"}).status_code == 200


def test_the_vlm_processors_own_refusal_is_a_400(vlm):
    """Whatever reaches the processor and is refused by it (here an image past 200:1 handed to it directly,
    without the media bound) is the item's 400, not a 500."""
    from PIL import Image

    from core.errors import InvalidInput
    from core.tasks.vlm_embed import input_conversation

    task = vlm.app.state.registry.engines["gme"].task
    with pytest.raises(InvalidInput, match=r"input\[0\]: the model's processor refused") as refused:
        task.item(input_conversation(None, 0, None, task.input_format), [Image.new("RGB", (600, 2))],
                  where="input[0]")
    assert refused.value.code == "invalid_media"
