"""Text Embeddings Inference (TEI) native routes, with TEI's field names and response shapes:
``POST /embed``, ``/embed_sparse``, ``/predict``, ``/tokenize``, ``GET /info`` (TEI's ``/rerank`` body,
``texts``, is answered on ``/rerank`` by ``core/api/routes/rerank.py``).

TEI serves one model per process: these routes take no ``model`` field; the one served model with the
capability answers (with several, ``?model=NAME`` picks one)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, tei_predict, tei_sparse, tei_tokens
from core.api.http import JSONBytes, deadline_for, serving_of, until_disconnect
from core.api.serving import embeddings, models, ranking

router = APIRouter()


def _model(request: Request) -> str | None:
    return request.query_params.get("model")


@router.post("/embed", summary="TEI: dense embeddings", tags=["tei"])
async def tei_embed(body: protocol.TeiEmbedRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed(serving, _model(request), body.inputs, deadline=deadline_for(request, serving),
                            embedding_type="float", truncate=body.truncate, normalize=body.normalize,
                            dimensions=body.dimensions, prompt_name=body.prompt_name, param="inputs")
    served = await until_disconnect(request, work)
    return JSONBytes(dumps(served.result.vectors))  # multi-vector models: a list of vectors per input


@router.post("/embed_sparse", summary="TEI: sparse embeddings", tags=["tei"])
async def tei_embed_sparse(body: protocol.TeiSparseRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed_sparse(serving, _model(request), body.inputs, truncate=body.truncate,
                                   deadline=deadline_for(request, serving), param="inputs")
    return JSONBytes(dumps(tei_sparse((await until_disconnect(request, work)).result.vectors)))


@router.post("/predict", summary="TEI: sequence classification", tags=["tei"])
async def tei_predict_route(body: protocol.TeiPredictRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = ranking.predict(serving, _model(request), body.inputs, deadline=deadline_for(request, serving),
                           raw_scores=body.raw_scores, truncate=body.truncate)
    served, single = await until_disconnect(request, work)
    return JSONBytes(dumps(tei_predict(served, single)))


@router.post("/tokenize", summary="TEI: tokenize", tags=["tei"])
async def tei_tokenize(body: protocol.TeiTokenizeRequest, request: Request) -> Response:
    serving = serving_of(request)
    engine = models.first_engine(serving, _model(request), "tokenize")
    work = models.tokenize(serving, engine, body.inputs, add_special_tokens=body.add_special_tokens,
                           deadline=deadline_for(request, serving), param="inputs")
    return JSONBytes(dumps(tei_tokens(await until_disconnect(request, work))))


@router.get("/info", summary="TEI: model and server information", tags=["tei"])
async def tei_info(request: Request) -> Response:
    serving = serving_of(request)
    engine = models.first_engine(serving, _model(request), "tokenize")
    return JSONBytes(dumps(models.tei_info(engine, serving.settings, request.app.version)))
