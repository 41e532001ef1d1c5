"""Multi-output models (BGE-M3 layout): one served model answers /v1/embeddings (dense), the sparse route and
/v1/score (ColBERT), on torch, ONNX and CTranslate2, against BGE-M3's published formulas computed directly
with transformers + torch on a tiny random XLM-RoBERTa carrying ``sparse_linear`` and ``colbert_linear``."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import InvalidInput
from core.loading import detect_task, read_model_info
from core.tasks.chunking import ChunkOptions, LateChunkOptions
from core.tasks.embed import EmbedRequest
from core.tasks.late_interaction import MaxSimRequest
from tests.support import chunk_reference, text_models
from tests.support.cache import CT2_SOURCES, ONNX_EXPORT_SOURCES, cached_build
from tests.support.engines import run_concurrently

SETTINGS = Settings(threads=2)
SOURCE = Path(text_models.__file__)
BACKENDS = {"torch": "torch", "onnx": "onnxruntime", "ct2": "ctranslate2"}
QUERY = "who wrote the theory of relativity?"


@pytest.fixture(scope="session")
def m3_dirs(minilm_dir):
    built = {}

    def get(backend: str = "torch") -> Path:
        if backend not in built:
            pytest.importorskip(BACKENDS[backend])
            src = cached_build("tiny-bge-m3", [SOURCE], partial(text_models.build_m3, minilm_dir))
            if backend == "onnx":
                from core.convert import onnx_export

                src = cached_build("tiny-bge-m3-onnx", [SOURCE, *ONNX_EXPORT_SOURCES],
                                   lambda out: onnx_export.export_folder(src, out))
            elif backend == "ct2":
                from core.convert import ct2

                src = cached_build("tiny-bge-m3-ct2", [SOURCE, *CT2_SOURCES],
                                   lambda out: ct2.convert_folder(src, out))
            built[backend] = src
        return built[backend]

    return get


@pytest.fixture(scope="session")
def m3_reference(m3_dirs, sentences):
    """BGE-M3's formulas (FlagEmbedding BGEM3FlagModel), one text at a time: dense = normalize(h[CLS]);
    sparse = max per token id of relu(sparse_linear(h)), special tokens dropped; colbert =
    normalize(colbert_linear(h[1:]))."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = m3_dirs("torch")
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    sparse, colbert = torch.nn.Linear(32, 1), torch.nn.Linear(32, 32)
    sparse.load_state_dict(torch.load(folder / "sparse_linear.pt", weights_only=True))
    colbert.load_state_dict(torch.load(folder / "colbert_linear.pt", weights_only=True))
    unused = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.unk_token_id}
    out = {}
    with torch.no_grad():
        for text in [QUERY, *sentences]:
            enc = tok(text, truncation=True, max_length=128, return_tensors="pt")
            h = model(**enc).last_hidden_state[0]
            weights = torch.relu(sparse(h))[:, 0].tolist()
            lexical: dict[int, float] = {}
            for tid, w in zip(enc["input_ids"][0].tolist(), weights):
                if tid not in unused and w > 0 and w > lexical.get(tid, 0):
                    lexical[tid] = w
            out[text] = (torch.nn.functional.normalize(h[0], dim=-1).numpy(), lexical,
                         torch.nn.functional.normalize(colbert(h[1:]), dim=-1).numpy())
    return out


def test_detected_as_multi_output(m3_dirs):
    assert detect_task(read_model_info(m3_dirs("torch"))) == "multi_output"


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_dense_sparse_and_colbert_match_the_formulas(m3_dirs, m3_reference, sentences, backend):
    engine = Engine.load(ModelSpec(path=m3_dirs(backend), backend=backend), SETTINGS)
    assert engine.task.name == "multi_output" and engine.backend.name == backend
    dense = engine.run_sync(EmbedRequest(texts=sentences)).vectors
    ref_dense = np.stack([m3_reference[s][0] for s in sentences])
    d_diff = np.abs(dense - ref_dense).max()
    assert d_diff <= 1e-5, d_diff

    sparse = engine.run_sync(EmbedRequest(texts=sentences, output="sparse")).vectors
    s_diff = 0.0
    for text, vec in zip(sentences, sparse):
        ref = m3_reference[text][1]
        assert vec.indices.tolist() == sorted(ref), text[:40]
        s_diff = max(s_diff, float(np.abs(vec.values - np.array([ref[i] for i in sorted(ref)])).max(initial=0)))
    assert s_diff <= 1e-5, s_diff
    assert sum(len(v.indices) for v in sparse) > 5 * len(sentences)  # most tokens carry weight

    docs = sentences[:20]
    scores = engine.run_sync(MaxSimRequest(query=QUERY, documents=docs)).scores
    q = m3_reference[QUERY][2]
    ref_scores = np.array([(q @ m3_reference[d][2].T).max(axis=1).mean() for d in docs])
    c_diff = np.abs(scores - ref_scores).max()
    assert c_diff <= 1e-5, c_diff
    assert np.ptp(ref_scores) > 100 * 1e-5  # the scores differ between documents far more than the error
    print(f"\n[parity] bge-m3 {backend}: dense {d_diff:.2e}, sparse {s_diff:.2e}, colbert score {c_diff:.2e}")


def test_one_served_model_answers_the_three_routes(m3_dirs, m3_reference, sentences):
    from fastapi.testclient import TestClient

    from core.api.app import create_app

    settings = Settings(models=[ModelSpec(path=m3_dirs("torch"), name="m3")], threads=2)
    docs = sentences[:3]
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/embeddings", json={"model": "m3", "input": docs})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, np.stack([m3_reference[d][0] for d in docs]), atol=1e-5)

        r = client.post("/v1/embeddings/sparse", json={"model": "m3", "input": docs})
        assert r.status_code == 200, r.text
        for item, text in zip(r.json()["data"], docs):
            assert item["embedding"]["indices"] == sorted(m3_reference[text][1])

        r = client.post("/embed_sparse", json={"inputs": docs})
        assert r.status_code == 200, r.text
        assert [[e["index"] for e in row] for row in r.json()] == [sorted(m3_reference[t][1]) for t in docs]

        r = client.post("/v1/score", json={"model": "m3", "query": QUERY, "documents": docs})
        assert r.status_code == 200, r.text
        q = m3_reference[QUERY][2]
        ref = [(q @ m3_reference[d][2].T).max(axis=1).mean() for d in docs]
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], ref, atol=1e-5)

        caps = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert "m3" in caps


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_mixed_requests_share_batches_and_equal_single_runs(m3_dirs, sentences, backend):
    """Dense, sparse and score requests arriving together share padded batches; each answer equals its
    own one-at-a-time run."""
    engine = Engine.load(ModelSpec(path=m3_dirs(backend), backend=backend), SETTINGS)
    texts = sentences[:16]
    requests = [EmbedRequest(texts=[t], output="sparse" if i % 2 else "pooled") for i, t in enumerate(texts)]
    requests.append(MaxSimRequest(query=QUERY, documents=texts[:5]))
    singles = [engine.run_sync(r) for r in requests]
    for req, single, batched in zip(requests, singles, run_concurrently(engine, requests)):
        if isinstance(req, MaxSimRequest):
            np.testing.assert_allclose(batched.scores, single.scores, atol=2e-5)
        elif req.output == "sparse":
            assert batched.vectors[0].indices.tolist() == single.vectors[0].indices.tolist()
            np.testing.assert_allclose(batched.vectors[0].values, single.vectors[0].values, atol=2e-5)
        else:
            np.testing.assert_allclose(batched.vectors, single.vectors, atol=2e-5)


# --- long inputs: the dense output in windows ---------------------------------------------------------

def m3_reference_chunked(folder: Path, text: str, size: int, overlap: int) -> tuple[np.ndarray, int]:
    """BGE-M3's dense vector (normalize(h[CLS])) of each overflowing window, the token-weighted mean,
    re-normalized; and the tokens embedded."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(str(folder)), AutoModel.from_pretrained(str(folder)).eval()
    return chunk_reference.chunked(tok, model, text, size, overlap, chunk_reference.cls_pool)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_chunking_the_dense_output(m3_dirs, sentences, backend):
    """A request's chunking and a spec's default both pool the windows' dense vectors into one per text."""
    folder = m3_dirs(backend)
    long_text = " ".join(sentences[:30])
    ref, tokens = m3_reference_chunked(m3_dirs("torch"), long_text, 48, 8)
    assert tokens > 128  # past the model's max length: several windows
    engine = Engine.load(ModelSpec(path=folder, backend=backend), SETTINGS)
    asked = engine.run_sync(EmbedRequest(texts=[long_text], chunking=ChunkOptions(48, 8)))
    by_default = Engine.load(ModelSpec(path=folder, backend=backend, chunking={"size": 48, "overlap": 8}),
                             SETTINGS).run_sync(EmbedRequest(texts=[long_text]))
    for result in (asked, by_default):
        diff = float(np.abs(result.vectors[0] - ref).max())
        assert diff <= 1e-5 and result.prompt_tokens == tokens, diff
    truncated = engine.run_sync(EmbedRequest(texts=[long_text])).vectors[0]
    assert np.abs(truncated - ref).max() > 1e-3
    print(f"\n[parity] bge-m3 chunked dense {backend}: {diff:.2e}")


def test_chunking_default_leaves_sparse_and_score_alone(m3_dirs, m3_reference, sentences):
    engine = Engine.load(ModelSpec(path=m3_dirs("torch"), chunking={"size": 48}), SETTINGS)
    sparse = engine.run_sync(EmbedRequest(texts=sentences[:3], output="sparse")).vectors
    assert [v.indices.tolist() for v in sparse] == [sorted(m3_reference[t][1]) for t in sentences[:3]]
    scores = engine.run_sync(MaxSimRequest(query=QUERY, documents=sentences[:3])).scores
    q = m3_reference[QUERY][2]
    np.testing.assert_allclose(scores, [(q @ m3_reference[d][2].T).max(axis=1).mean() for d in sentences[:3]],
                               atol=1e-5)
    with pytest.raises(InvalidInput, match="late_chunking"):
        engine.run_sync(EmbedRequest(texts=sentences[:3], late_chunking=LateChunkOptions()))
