"""Text Embeddings Inference (TEI) native routes, with TEI's field names and response shapes:
``POST /embed``, ``/embed_sparse``, ``/predict``, ``/tokenize``, ``GET /info``; TEI's ``/rerank`` body
(``texts``) is answered by :func:`tei_rerank`, dispatched from ``core/api/routes/rerank.py``.

TEI serves one model per process: these routes take no ``model`` field; the one served model with the
capability answers (with several, ``?model=NAME`` picks one)."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, tei_sparse
from core.api.routes.common import (
    JSONBytes, deadline_for, registry_of, serve_until_disconnect, settings_of, tokenize_pieces,
)
from core.api.routes.inputs import check_texts, text_list
from core.errors import InvalidInput
from core.tasks.classify import ClassifyRequest, labels_of
from core.tasks.embed import EmbedRequest
from core.tasks.rerank import RerankRequest

router = APIRouter()


def _engine(request: Request, capability: str):
    return registry_of(request).get(request.query_params.get("model"), capability)


def _first_engine(request: Request, capability: str):
    """``/tokenize`` and ``/info``: every text model has them; without ``?model=`` the first served model
    answers (a TEI process serves one)."""
    registry = registry_of(request)
    name = request.query_params.get("model")
    if name is None and registry.engines:
        name = next(iter(registry.engines))
    return registry.get(name, capability)


async def _run(request: Request, engine, task_request):
    settings = settings_of(request)
    return await serve_until_disconnect(request, engine(task_request, deadline=deadline_for(request, settings)))


@router.post("/embed", summary="TEI: dense embeddings", tags=["tei"])
async def tei_embed(body: protocol.TeiEmbedRequest, request: Request) -> Response:
    engine = _engine(request, "embeddings")
    texts = text_list(body.inputs, "inputs", settings_of(request))
    result = await _run(request, engine, EmbedRequest(
        texts=texts, truncate=body.truncate, normalize=body.normalize, dimensions=body.dimensions,
        prompt_name=body.prompt_name,
    ))
    return JSONBytes(dumps(result.vectors))  # multi-vector models: a list of vectors per input


@router.post("/embed_sparse", summary="TEI: sparse embeddings", tags=["tei"])
async def tei_embed_sparse(body: protocol.TeiSparseRequest, request: Request) -> Response:
    engine = _engine(request, "embeddings_sparse")
    texts = text_list(body.inputs, "inputs", settings_of(request))
    result = await _run(request, engine, EmbedRequest(texts=texts, truncate=body.truncate, output="sparse"))
    return JSONBytes(dumps(tei_sparse(result.vectors)))


def _predict_inputs(value) -> tuple[list[str] | None, list[tuple[str, str]] | None, bool]:
    """TEI's /predict ``inputs``: a string; a [text, text_pair] pair; or a batch of strings or pairs.
    Returns (texts, pairs, single)."""
    if isinstance(value, str):
        return [value], None, True
    if not value:
        raise InvalidInput("'inputs' must not be empty", param="inputs")
    if all(isinstance(v, str) for v in value):
        if len(value) == 2:  # TEI reads a two-string list as one (text, text_pair)
            return None, [(value[0], value[1])], True
        return list(value), None, False
    if all(isinstance(v, list) for v in value):
        pairs = []
        for i, v in enumerate(value):
            if len(v) == 1:
                pairs.append((v[0], None))
            elif len(v) == 2:
                pairs.append((v[0], v[1]))
            else:
                raise InvalidInput(f"inputs[{i}] must be [text] or [text, text_pair]", param="inputs")
        if all(b is None for _, b in pairs):
            return [a for a, _ in pairs], None, False
        if any(b is None for _, b in pairs):
            raise InvalidInput("inputs: mix of single texts and pairs in one batch", param="inputs")
        return None, pairs, False
    raise InvalidInput("inputs: expected a string, a [text, text_pair] pair, or a list of them", param="inputs")


@router.post("/predict", summary="TEI: sequence classification", tags=["tei"])
async def tei_predict(body: protocol.TeiPredictRequest, request: Request) -> Response:
    engine = _engine(request, "classify")
    settings = settings_of(request)
    texts, pairs, single = _predict_inputs(body.inputs)
    check_texts(texts if texts is not None else [t for pair in pairs for t in pair], settings, "inputs")
    result = await _run(request, engine, ClassifyRequest(
        texts=texts, pairs=pairs, raw_scores=body.raw_scores, truncate=body.truncate,
    ))
    out = []
    for row in result.scores:
        order = np.argsort(-row, kind="stable")
        out.append([{"score": float(row[j]), "label": result.labels[j]} for j in order])
    return JSONBytes(dumps(out[0] if single else out))


async def tei_rerank(body: protocol.RerankRequest, request: Request) -> Response:
    """TEI's /rerank: ``query``, ``texts``, ``raw_scores``, ``return_text``, ``truncate`` →
    ``[{index, score, text?}]`` sorted by score."""
    engine = registry_of(request).get(body.model or request.query_params.get("model"), "rerank")
    texts = list(body.texts or [])
    if not texts:
        raise InvalidInput("'texts' must not be empty", param="texts")
    check_texts(texts, settings_of(request), "texts")
    result = await _run(request, engine, RerankRequest(
        query=body.query, documents=texts, raw_scores=body.raw_scores, truncate=body.truncate,
    ))
    order = np.argsort(-result.scores, kind="stable")
    out = []
    for j in order:
        item = {"index": int(j), "score": float(result.scores[j])}
        if body.return_text:
            item["text"] = texts[j]
        out.append(item)
    return JSONBytes(dumps(out))


@router.post("/tokenize", summary="TEI: tokenize", tags=["tei"])
async def tei_tokenize(body: protocol.TeiTokenizeRequest, request: Request) -> Response:
    engine = _first_engine(request, "tokenize")
    texts = text_list(body.inputs, "inputs", settings_of(request))
    pieces = await tokenize_pieces(request, engine.task.tokenizer, texts, add_special_tokens=body.add_special_tokens)
    return JSONBytes(dumps([
        [{"id": p.id, "text": p.text, "special": p.special, "start": p.start, "stop": p.stop} for p in row]
        for row in pieces
    ]))


def _model_type(engine) -> dict:
    task = engine.task
    if task.name in ("rerank", "classify"):
        labels = labels_of(task.info.config)
        kind = "reranker" if task.name == "rerank" else "classifier"
        return {kind: {"id2label": {str(i): lab for i, lab in enumerate(labels)},
                       "label2id": {lab: i for i, lab in enumerate(labels)}}}
    if task.name == "sparse":
        return {"embedding": {"pooling": "splade"}}
    # the pooling in force (the spec's `pooling` override included), as the task describes it
    return {"embedding": {"pooling": task.describe().get("pooling") or getattr(task.info, "pooling", "mean")}}


@router.get("/info", summary="TEI: model and server information", tags=["tei"])
async def tei_info(request: Request) -> Response:
    engine = _first_engine(request, "tokenize")
    settings = settings_of(request)
    spec = engine.spec
    return JSONBytes(dumps({
        "model_id": engine.name,
        "model_sha": engine.model_sha,
        "model_dtype": spec.dtype,
        "model_type": _model_type(engine),
        "max_concurrent_requests": spec.max_queue_items,
        "max_input_length": engine.task.info.max_length,
        "max_batch_tokens": spec.batch_tokens,
        "max_batch_requests": spec.max_batch_size,
        "max_client_batch_size": settings.max_items_per_request,
        "auto_truncate": True,
        "tokenization_workers": settings.threads,
        "version": request.app.version,
        "backend": engine.backend.describe().get("backend"),
        "task": engine.task.name,
        "capabilities": sorted(engine.task.capabilities),
    }))
