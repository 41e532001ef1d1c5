"""Text Embeddings Inference (TEI) native routes, with TEI's field names and response shapes:
``POST /embed``, ``/embed_sparse``, ``/predict``, ``/tokenize``, ``GET /info`` (TEI's ``/rerank`` body,
``texts``, is answered on ``/rerank`` by ``core/api/routes/rerank.py``).

TEI serves one model per process: these routes take no ``model`` field; the one served model with the
capability answers (with several, ``?model=NAME`` picks one)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, tei_predict, tei_rerank, tei_sparse, tei_tokens
from core.api.http import (
    JSONBytes, deadline_for, model_choice, read_json_object, serving_of, until_disconnect, validated,
)
from core.api.serving import embeddings, models, ranking
from core.errors import ModelNotFound, Unsupported

router = APIRouter()


_model = model_choice


@router.post("/embed", summary="TEI: dense embeddings", tags=["tei"])
async def tei_embed(body: protocol.TeiEmbedRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed(serving, _model(request), body.inputs, deadline=deadline_for(request, serving),
                            embedding_type="float", direction=body.truncation_direction, truncate=body.truncate,
                            normalize=body.normalize, dimensions=body.dimensions, prompt_name=body.prompt_name,
                            param="inputs")
    served = await until_disconnect(request, work)
    return JSONBytes(dumps(served.result.vectors))  # multi-vector models: a list of vectors per input


@router.post("/embed_all", summary="TEI: every token's embedding", tags=["tei"])
async def tei_embed_all(body: protocol.TeiEmbedAllRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed_all(serving, _model(request), body.inputs, truncate=body.truncate,
                                deadline=deadline_for(request, serving), prompt_name=body.prompt_name,
                                direction=body.truncation_direction)
    return JSONBytes(dumps((await until_disconnect(request, work)).result.vectors))


@router.post("/embed_sparse", summary="TEI: sparse embeddings", tags=["tei"])
async def tei_embed_sparse(body: protocol.TeiSparseRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed_sparse(serving, _model(request), body.inputs, truncate=body.truncate,
                                   deadline=deadline_for(request, serving), prompt_name=body.prompt_name,
                                   direction=body.truncation_direction, param="inputs")
    return JSONBytes(dumps(tei_sparse((await until_disconnect(request, work)).result.vectors)))


@router.post("/similarity", summary="TEI: cosine similarity of sentences to a source sentence", tags=["tei"])
async def tei_similarity(body: protocol.TeiSimilarityRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.similarity(serving, _model(request), body.inputs.source_sentence, body.inputs.sentences,
                                 deadline=deadline_for(request, serving), truncate=body.truncate,
                                 prompt_name=body.prompt_name, direction=body.truncation_direction)
    return JSONBytes(dumps((await until_disconnect(request, work)).result.scores))


@router.post("/predict", summary="TEI: sequence classification", tags=["tei"])
async def tei_predict_route(body: protocol.TeiPredictRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = ranking.predict(serving, _model(request), body.inputs, deadline=deadline_for(request, serving),
                           raw_scores=body.raw_scores, truncate=body.truncate, direction=body.truncation_direction)
    served, single = await until_disconnect(request, work)
    return JSONBytes(dumps(tei_predict(served, single)))


@router.post("/tokenize", summary="TEI: tokenize", tags=["tei"])
async def tei_tokenize(body: protocol.TeiTokenizeRequest, request: Request) -> Response:
    serving = serving_of(request)
    engine = models.first_engine(serving, _model(request), "tokenize")
    work = models.tokenize(serving, engine, body.inputs, add_special_tokens=body.add_special_tokens,
                           deadline=deadline_for(request, serving), prompt_name=body.prompt_name, param="inputs")
    return JSONBytes(dumps(tei_tokens(await until_disconnect(request, work))))


@router.post("/decode", summary="TEI: token ids back to text", tags=["tei"])
async def tei_decode(body: protocol.TeiDecodeRequest, request: Request) -> Response:
    engine = models.first_engine(serving_of(request), _model(request), "tokenize")
    texts = models.decode(engine, body.ids, skip_special_tokens=body.skip_special_tokens).result
    return JSONBytes(dumps(texts))


@router.get("/info", summary="TEI: model and server information", tags=["tei"])
async def tei_info(request: Request) -> Response:
    serving = serving_of(request)
    engine = models.first_engine(serving, _model(request), "tokenize")
    return JSONBytes(dumps(models.tei_info(engine, serving.settings, request.app.version)))


@router.post("/", summary="TEI / Hugging Face Inference: the served model's own task", tags=["tei"])
async def tei_root(request: Request) -> Response:
    """What ``huggingface_hub.InferenceClient(base_url=...)`` posts to: the model's task answers
    (embed, predict, rerank, sparse), or ``/similarity`` when ``inputs`` holds a ``source_sentence``.
    Classification answers in the Inference API's batch shape (a list per input)."""
    body = await read_json_object(request)
    registry = serving_of(request).registry
    if _model(request) is None and len(registry.engines) + len(registry.failed) > 1:
        raise ModelNotFound(f"several models are served ({sorted({*registry.engines, *registry.failed})}) and the "
                            "request names none: name one with ?model=NAME or an X-Model: NAME header (the 'model' "
                            "field of /v1/embeddings, /v1/rerank ...)", param="model")
    inputs = body.get("inputs")
    if isinstance(inputs, dict) and "source_sentence" in inputs:
        return await tei_similarity(validated(protocol.TeiSimilarityRequest, body), request)
    engine = models.first_engine(serving_of(request), _model(request), "tokenize")
    capabilities = engine.task.capabilities
    if "classify" in capabilities:
        serving = serving_of(request)
        parsed = validated(protocol.TeiPredictRequest, body)
        work = ranking.predict(serving, engine.name, parsed.inputs, deadline=deadline_for(request, serving),
                               raw_scores=parsed.raw_scores, truncate=parsed.truncate,
                               direction=parsed.truncation_direction)
        served, single = await until_disconnect(request, work)
        answer = tei_predict(served, single)
        return JSONBytes(dumps([answer] if single else answer))
    if "rerank" in capabilities:
        serving = serving_of(request)
        parsed = validated(protocol.RerankRequest, body)
        work = ranking.rerank(serving, engine.name, parsed.query, parsed.texts, deadline=deadline_for(request, serving),
                              raw_scores=parsed.raw_scores, truncate=parsed.truncate,
                              direction=parsed.truncation_direction, param="texts")
        served, texts = await until_disconnect(request, work)
        return JSONBytes(dumps(tei_rerank(served, texts, parsed.return_text)))
    if "embeddings" in capabilities:
        return await tei_embed(validated(protocol.TeiEmbedRequest, body), request)
    if "embeddings_sparse" in capabilities:
        return await tei_embed_sparse(validated(protocol.TeiSparseRequest, body), request)
    raise Unsupported(f"model {engine.name!r} ({engine.task.name}) has no TEI task to answer on /")
