"""Text Embeddings Inference (TEI)'s server routes: ``GET /info`` and ``POST /``, the served model's own task.
TEI's task routes live with their features (each feature's ``tei.py``: ``/embed``, ``/embed_all``,
``/similarity``, ``/embed_sparse``, ``/predict``, ``/tokenize``, ``/decode``; TEI's ``/rerank`` body,
``texts``, is answered on ``/rerank`` by ``core/api/rerank/routes.py``).

TEI serves one model per process: these routes take no ``model`` field; the one served model answers
(with several, ``?model=NAME`` picks one)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.classify.encode import tei_predict
from core.api.classify.schemas import TeiPredictRequest
from core.api.common import dumps
from core.api.embeddings.schemas import TeiEmbedRequest, TeiSimilarityRequest
from core.api.embeddings.tei import tei_embed, tei_similarity
from core.api.http import (
    JSONBytes, deadline_for, model_choice, read_json_object, serving_of, until_disconnect, validated,
)
from core.api.rerank.encode import tei_rerank
from core.api.rerank.schemas import RerankRequest
from core.api.sparse.schemas import TeiSparseRequest
from core.api.sparse.tei import tei_embed_sparse
from core.capabilities import Capability
from core.errors import ModelNotFound, Unsupported
from core.serving import models, ranking

router = APIRouter()



@router.get("/info", summary="TEI: model and server information", tags=["tei"])
async def tei_info(request: Request) -> Response:
    serving = serving_of(request)
    engine = models.first_engine(serving, model_choice(request), Capability.TOKENIZE)
    return JSONBytes(dumps(models.tei_info(engine, serving.settings, request.app.version)))


@router.post("/", summary="TEI / Hugging Face Inference: the served model's own task", tags=["tei"])
async def tei_root(request: Request) -> Response:
    """What ``huggingface_hub.InferenceClient(base_url=...)`` posts to: the model's task answers
    (embed, predict, rerank, sparse), or ``/similarity`` when ``inputs`` holds a ``source_sentence``.
    Classification answers in the Inference API's batch shape (a list per input)."""
    body = await read_json_object(request)
    registry = serving_of(request).registry
    if model_choice(request) is None and len(registry.engines) + len(registry.failed) > 1:
        raise ModelNotFound(f"several models are served ({sorted({*registry.engines, *registry.failed})}) and the "
                            "request names none: name one with ?model=NAME or an X-Model: NAME header (the 'model' "
                            "field of /v1/embeddings, /v1/rerank ...)", param="model")
    inputs = body.get("inputs")
    if isinstance(inputs, dict) and "source_sentence" in inputs:
        return await tei_similarity(validated(TeiSimilarityRequest, body), request)
    engine = models.first_engine(serving_of(request), model_choice(request), Capability.TOKENIZE)
    capabilities = engine.task.capabilities
    if Capability.CLASSIFY in capabilities:
        serving = serving_of(request)
        parsed = validated(TeiPredictRequest, body)
        work = ranking.predict(serving, engine.name, parsed.inputs, deadline=deadline_for(request, serving),
                               raw_scores=parsed.raw_scores, truncate=parsed.truncate,
                               direction=parsed.truncation_direction)
        served, single = await until_disconnect(request, work)
        answer = tei_predict(served, single)
        return JSONBytes(dumps([answer] if single else answer))
    if Capability.RERANK in capabilities:
        serving = serving_of(request)
        parsed = validated(RerankRequest, body)
        work = ranking.rerank(serving, engine.name, parsed.query, parsed.texts, deadline=deadline_for(request, serving),
                              raw_scores=parsed.raw_scores, truncate=parsed.truncate,
                              direction=parsed.truncation_direction, param="texts")
        served, texts = await until_disconnect(request, work)
        return JSONBytes(dumps(tei_rerank(served, texts, parsed.return_text)))
    if Capability.EMBEDDINGS in capabilities:
        return await tei_embed(validated(TeiEmbedRequest, body), request)
    if Capability.EMBEDDINGS_SPARSE in capabilities:
        return await tei_embed_sparse(validated(TeiSparseRequest, body), request)
    raise Unsupported(f"model {engine.name!r} ({engine.task.name}) has no TEI task to answer on /")
