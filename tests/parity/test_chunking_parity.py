"""Long inputs on the embed task, with the real all-MiniLM-L6-v2 weights (mean pooling, normalized), on torch and
ONNX. References are computed directly from the model's token vectors with transformers (AutoTokenizer +
AutoModel on the same folder):

- chunking: the tokenizer's own overflowing windows (``truncation=True, max_length=size, stride=overlap,
  return_overflowing_tokens=True``), each mean-pooled and normalized, averaged weighted by their token counts,
  re-normalized;
- late chunking (Jina): the token vectors of one pass over the whole context (windows of the max length past
  it), each chunk the normalized mean of the non-special tokens its character span overlaps."""

from __future__ import annotations


import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import InvalidInput
from core.tasks.chunking import ChunkOptions, LateChunkOptions
from core.tasks.embed import EmbedRequest
from tests.support import chunk_reference
from tests.support.engines import run_concurrently

SETTINGS = Settings(threads=2)
TOL = 1e-5

PARAGRAPHS = [
    "Berlin is the capital and largest city of Germany, both by area and by population. Its more than 3.85 "
    "million inhabitants make it the European Union's most populous city.",
    "The city is also one of the states of Germany and is the third smallest state in the country in terms "
    "of area. Berlin is surrounded by the state of Brandenburg.",
    "Cats are small, carnivorous mammals. They sleep for most of the day and are active at dusk.",
    "Photosynthesis converts light energy into chemical energy that fuels the activities of plants.",
]
LONG = " ".join(PARAGRAPHS * 6)  # several hundred tokens: over MiniLM's 256


@pytest.fixture(scope="module")
def hf(minilm_dir):
    import torch
    from transformers import AutoModel, AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir)), AutoModel.from_pretrained(
        str(minilm_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engines(minilm_dir, minilm_onnx_dir, request):
    made = {}

    def get(backend: str, **spec) -> Engine:
        key = (backend, repr(sorted(spec.items())))
        if key not in made:
            path = {"torch": minilm_dir, "onnx": minilm_onnx_dir}.get(backend) \
                or request.getfixturevalue("minilm_ct2_dir")
            made[key] = Engine.load(ModelSpec(path=path, backend=backend, **spec), SETTINGS)
        return made[key]

    return get


def reference_chunked(hf, text: str, size: int, overlap: int) -> tuple[np.ndarray, int]:
    return chunk_reference.chunked(*hf, text, size, overlap, chunk_reference.mean_pool)


def reference_token_vectors(hf, text: str, max_length: int, overlap: int = 0):
    """Each context token's vector (special tokens dropped), from windows of ``max_length`` when longer; a
    token held by two windows takes the first one's vector. Returns (vectors, character offsets)."""
    tok, model = hf
    plain = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    hidden, enc = chunk_reference.window_states(tok, model, text, max_length, overlap,
                                                return_special_tokens_mask=True)
    special, mask = enc["special_tokens_mask"].numpy(), enc["attention_mask"].numpy()
    rows = []
    for k in range(hidden.shape[0]):
        real = hidden[k][(mask[k] == 1) & (special[k] == 0)]
        rows.append(real if k == 0 else real[overlap:])
    vectors = np.concatenate(rows)
    assert vectors.shape[0] == len(plain["input_ids"])
    return vectors, np.asarray(plain["offset_mapping"])


def reference_late(hf, text: str, spans, max_length: int, overlap: int = 0) -> np.ndarray:
    vectors, offsets = reference_token_vectors(hf, text, max_length, overlap)
    out = []
    for start, end in spans:
        inside = (offsets[:, 0] < end) & (offsets[:, 1] > start)
        out.append(vectors[inside].mean(0))
    return chunk_reference.normalize(np.stack(out))


WORST: dict[str, float] = {}


def _record(kind: str, backend: str, diff: float) -> None:
    WORST[f"{kind} {backend}"] = max(WORST.get(f"{kind} {backend}", 0.0), diff)
    print(f"\n[parity] {kind} {backend}: max abs diff {diff:.2e}")


@pytest.mark.parametrize("size, overlap", [(None, 0), (64, 16), (32, 0)])
@pytest.mark.parametrize("backend", ["torch", "onnx", "ct2"])
def test_chunking_parity(engines, hf, backend, size, overlap):
    engine = engines(backend)
    texts = [LONG, PARAGRAPHS[0]]
    result = engine.run_sync(EmbedRequest(texts=texts, chunking=ChunkOptions(size, overlap)))
    refs = [reference_chunked(hf, t, size or engine.task.info.max_length, overlap) for t in texts]
    got = result.vectors
    diff = float(np.abs(got - np.stack([r[0] for r in refs])).max())
    _record("chunking", backend, diff)
    assert got.shape == (2, 384) and diff <= TOL
    assert result.prompt_tokens == sum(r[1] for r in refs)  # every token embedded, overlaps included
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_chunking_a_short_text_is_its_plain_embedding(engines):
    engine = engines("torch")
    plain = engine.run_sync(EmbedRequest(texts=PARAGRAPHS)).vectors
    chunked = engine.run_sync(EmbedRequest(texts=PARAGRAPHS, chunking=ChunkOptions())).vectors
    np.testing.assert_allclose(chunked, plain, atol=1e-6)


def test_chunking_differs_from_truncation(engines):
    engine = engines("torch")
    truncated = engine.run_sync(EmbedRequest(texts=[LONG])).vectors[0]
    chunked = engine.run_sync(EmbedRequest(texts=[LONG], chunking=ChunkOptions(64, 8))).vectors[0]
    assert np.abs(truncated - chunked).max() > 100 * TOL


@pytest.mark.parametrize("backend", ["torch", "onnx", "ct2"])
def test_late_chunking_spans_parity(engines, hf, backend):
    engine = engines(backend)
    text = " ".join(PARAGRAPHS)
    spans, at = [], 0
    for p in PARAGRAPHS:
        spans.append((at, at + len(p)))
        at += len(p) + 1
    result = engine.run_sync(EmbedRequest(texts=[text], late_chunking=LateChunkOptions(spans=spans)))
    ref = reference_late(hf, text, spans, engine.task.info.max_length)
    diff = float(np.abs(result.vectors - ref).max())
    _record("late chunking", backend, diff)
    assert result.vectors.shape == (4, 384) and diff <= TOL
    # the chunks see each other: not the vectors of the chunks embedded alone
    alone = engine.run_sync(EmbedRequest(texts=PARAGRAPHS)).vectors
    assert np.abs(result.vectors - alone).max() > 100 * TOL
    # a list of chunks joined by the separator is the same context
    joined = engine.run_sync(EmbedRequest(texts=PARAGRAPHS, late_chunking=LateChunkOptions())).vectors
    np.testing.assert_allclose(joined, result.vectors, atol=1e-6)


@pytest.mark.parametrize("overlap", [0, 32])
@pytest.mark.parametrize("backend", ["torch", "onnx", "ct2"])
def test_late_chunking_past_the_max_length(engines, hf, backend, overlap):
    engine = engines(backend, max_length=128)
    chunks = PARAGRAPHS * 4
    result = engine.run_sync(EmbedRequest(texts=chunks, late_chunking=LateChunkOptions(overlap=overlap)))
    text = " ".join(chunks)
    spans, at = [], 0
    for c in chunks:
        spans.append((at, at + len(c)))
        at += len(c) + 1
    ref = reference_late(hf, text, spans, 128, overlap)
    diff = float(np.abs(result.vectors - ref).max())
    _record("late chunking (windows)", backend, diff)
    assert result.vectors.shape == (len(chunks), 384) and diff <= TOL
    tok = hf[0]
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    assert result.prompt_tokens > n  # several windows, each with its special tokens


def test_batched_through_batcher_equals_single(engines):
    engine = engines("torch")
    requests = [EmbedRequest(texts=[LONG], chunking=ChunkOptions(64, 16)),
                EmbedRequest(texts=PARAGRAPHS, late_chunking=LateChunkOptions()),
                EmbedRequest(texts=PARAGRAPHS)]
    singles = [engine.run_sync(r).vectors for r in requests]
    for got, want in zip(run_concurrently(engine, requests), singles):
        np.testing.assert_allclose(got.vectors, want, atol=2e-6)


@pytest.mark.parametrize("request_kwargs, match", [
    ({"texts": [LONG], "chunking": ChunkOptions(8, 8)}, "overlap"),
    ({"texts": [LONG], "chunking": ChunkOptions(1000, 0)}, "max length"),
    ({"token_ids": [[101, 102]], "chunking": ChunkOptions()}, "text input"),
    ({"texts": [LONG], "chunking": ChunkOptions(), "prompt": "query: "}, "prompt"),
    ({"texts": ["ab cd"], "late_chunking": LateChunkOptions(spans=[(0, 9)])}, "not a span"),
    ({"texts": ["a", "b"], "late_chunking": LateChunkOptions(spans=[(0, 1)])}, "one input"),
    ({"texts": ["ab  cd"], "late_chunking": LateChunkOptions(spans=[(2, 4)])}, "no token"),
])
def test_bad_options_are_refused(engines, request_kwargs, match):
    with pytest.raises(InvalidInput, match=match):
        engines("torch").run_sync(EmbedRequest(**request_kwargs))


def test_other_tasks_refuse_chunking(splade_dir):
    engine = Engine.load(ModelSpec(path=splade_dir), SETTINGS)
    with pytest.raises(InvalidInput, match="chunking"):
        engine.run_sync(EmbedRequest(texts=[LONG], chunking=ChunkOptions()))


def test_openai_route(minilm_dir, hf):
    """The OpenAI route takes both as extensions; usage counts every token embedded."""
    from fastapi.testclient import TestClient

    from core.api.app import create_app

    settings = Settings(models=[ModelSpec(path=minilm_dir, name="minilm")], threads=2)
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/embeddings", json={"model": "minilm", "input": [LONG],
                                                "chunking": {"size": 64, "overlap": 16}})
        assert r.status_code == 200, r.text
        ref, tokens = reference_chunked(hf, LONG, 64, 16)
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], ref, atol=TOL)
        assert r.json()["usage"]["prompt_tokens"] == tokens
        r = client.post("/v1/embeddings", json={"model": "minilm", "input": PARAGRAPHS, "late_chunking": True})
        assert r.status_code == 200, r.text
        assert [d["index"] for d in r.json()["data"]] == [0, 1, 2, 3]
        r = client.post("/v1/embeddings", json={"model": "minilm", "input": "ab cd",
                                                "late_chunking": {"spans": [[0, 2], [3, 5]]}})
        assert r.status_code == 200 and len(r.json()["data"]) == 2, r.text
        r = client.post("/v1/embeddings", json={"model": "minilm", "input": [LONG], "chunking": {"size": -1}})
        assert r.status_code == 422 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = client.post("/v1/embeddings", json={"model": "minilm", "input": "ab", "late_chunking": {"spans": [[0, 7]]}})
        assert r.status_code == 400 and "span" in r.json()["error"]["message"]


# --- a model's default (the spec's chunking) ------------------------------------------------------------

@pytest.mark.parametrize("backend", ["torch", "onnx", "ct2"])
def test_spec_default_parity_and_opt_out(engines, hf, backend):
    """A spec's chunking applies to requests that say nothing of long inputs; ``chunking=False`` turns it
    off (the truncated embedding), ``True`` asks for the default's windows."""
    engine = engines(backend, chunking={"size": 64, "overlap": 16})
    texts = [LONG, PARAGRAPHS[0]]
    refs = [reference_chunked(hf, t, 64, 16) for t in texts]
    result = engine.run_sync(EmbedRequest(texts=texts))
    diff = float(np.abs(result.vectors - np.stack([r[0] for r in refs])).max())
    _record("chunking (spec default)", backend, diff)
    assert diff <= TOL and result.prompt_tokens == sum(r[1] for r in refs)
    np.testing.assert_allclose(engine.run_sync(EmbedRequest(texts=texts, chunking=True)).vectors, result.vectors,
                               atol=1e-6)
    plain = engines(backend).run_sync(EmbedRequest(texts=texts))
    off = engine.run_sync(EmbedRequest(texts=texts, chunking=False))
    np.testing.assert_allclose(off.vectors, plain.vectors, atol=1e-6)
    assert off.prompt_tokens == plain.prompt_tokens < result.prompt_tokens
    # a request's own windows win over the default
    own = engine.run_sync(EmbedRequest(texts=[LONG], chunking=ChunkOptions(32, 0))).vectors[0]
    np.testing.assert_allclose(own, reference_chunked(hf, LONG, 32, 0)[0], atol=TOL)


def test_chunking_true_without_a_default_is_the_max_length(engines, hf):
    engine = engines("torch")
    got = engine.run_sync(EmbedRequest(texts=[LONG], chunking=True)).vectors[0]
    np.testing.assert_allclose(got, reference_chunked(hf, LONG, engine.task.info.max_length, 0)[0], atol=TOL)


def test_spec_default_leaves_token_ids_and_prompts_as_they_are(engines):
    """Requests the default cannot apply to (token ids, a prompt, late chunking) are served as without it."""
    engine, plain = engines("torch", chunking={"size": 64, "overlap": 0}), engines("torch")
    for request in (dict(token_ids=[[101, 7592, 2088, 102]]), dict(texts=[LONG], prompt="query: "),
                    dict(texts=PARAGRAPHS, late_chunking=LateChunkOptions())):
        np.testing.assert_allclose(engine.run_sync(EmbedRequest(**request)).vectors,
                                   plain.run_sync(EmbedRequest(**request)).vectors, atol=1e-6)


def test_a_default_no_request_could_use_is_refused_at_load(minilm_dir, splade_dir):
    with pytest.raises(InvalidInput, match="chunking default .* task is 'sparse'"):
        Engine.load(ModelSpec(path=splade_dir, chunking={"size": 64}), SETTINGS, warm_up=False)
    with pytest.raises(InvalidInput, match="default prompt"):
        Engine.load(ModelSpec(path=minilm_dir, prompts={"query": "query: "}, default_prompt_name="query",
                              chunking={"size": 64}), SETTINGS, warm_up=False)
    with pytest.raises(ValueError, match="overlap"):
        ModelSpec(path=minilm_dir, chunking={"size": 64, "overlap": -1})


def test_spec_default_over_http(minilm_dir, hf):
    """TESSERA_MODELS carries the default; the OpenAI route takes chunking true/false."""
    from fastapi.testclient import TestClient

    from core.api.app import create_app
    from core.config import settings_from_env

    models = f'[{{"path": "{minilm_dir}", "name": "long", "chunking": {{"size": 64, "overlap": 16}}}}]'
    settings = settings_from_env({"TESSERA_MODELS": models, "TESSERA_THREADS": "2"}, Settings)
    ref, tokens = reference_chunked(hf, LONG, 64, 16)
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/embeddings", json={"model": "long", "input": [LONG]})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], ref, atol=TOL)
        assert r.json()["usage"]["prompt_tokens"] == tokens
        r = client.post("/v1/embeddings", json={"model": "long", "input": [LONG], "chunking": False})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == engine_max(minilm_dir)
        r = client.post("/v1/embeddings", json={"model": "long", "input": [LONG], "chunking": True})
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], ref, atol=TOL)


def engine_max(folder) -> int:
    from core.loading import read_model_info

    return read_model_info(folder).max_length
