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
def engines(minilm_dir, minilm_onnx_dir):
    made = {}

    def get(backend: str, **spec) -> Engine:
        key = (backend, tuple(sorted(spec.items())))
        if key not in made:
            path = minilm_dir if backend == "torch" else minilm_onnx_dir
            made[key] = Engine.load(ModelSpec(path=path, backend=backend, **spec), SETTINGS)
        return made[key]

    return get


def _normalize(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def reference_chunked(hf, text: str, size: int, overlap: int) -> tuple[np.ndarray, int]:
    import torch

    tok, model = hf
    enc = tok(text, truncation=True, max_length=size, stride=overlap, return_overflowing_tokens=True,
              padding=True, return_tensors="pt")
    enc.pop("overflow_to_sample_mapping")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state.numpy()
    mask = enc["attention_mask"].numpy()[:, :, None].astype(np.float32)
    windows = _normalize((hidden * mask).sum(1) / mask.sum(1))
    weights = mask.sum((1, 2))
    return _normalize((windows * weights[:, None]).sum(0) / weights.sum()), int(weights.sum())


def reference_token_vectors(hf, text: str, max_length: int, overlap: int = 0):
    """Each context token's vector (special tokens dropped), from windows of ``max_length`` when longer; a
    token held by two windows takes the first one's vector. Returns (vectors, character offsets)."""
    import torch

    tok, model = hf
    plain = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    enc = tok(text, truncation=True, max_length=max_length, stride=overlap, return_overflowing_tokens=True,
              padding=True, return_tensors="pt", return_special_tokens_mask=True)
    enc.pop("overflow_to_sample_mapping")
    special = enc.pop("special_tokens_mask").numpy()
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state.numpy()
    mask = enc["attention_mask"].numpy()
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
    return _normalize(np.stack(out))


WORST: dict[str, float] = {}


def _record(kind: str, backend: str, diff: float) -> None:
    WORST[f"{kind} {backend}"] = max(WORST.get(f"{kind} {backend}", 0.0), diff)
    print(f"\n[parity] {kind} {backend}: max abs diff {diff:.2e}")


@pytest.mark.parametrize("size, overlap", [(None, 0), (64, 16), (32, 0)])
@pytest.mark.parametrize("backend", ["torch", "onnx"])
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


@pytest.mark.parametrize("backend", ["torch", "onnx"])
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
@pytest.mark.parametrize("backend", ["torch", "onnx"])
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
