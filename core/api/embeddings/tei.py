"""Text Embeddings Inference (TEI) routes of the embeddings feature, with TEI's field names and answers:
``POST /embed``, ``/embed_all``, ``/similarity``. TEI serves one model per process: these routes take no
``model`` field; the one served model with the capability answers (with several, ``?model=NAME`` picks one)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import dumps
from core.api.embeddings import schemas
from core.api.http import JSONBytes, deadline_for, model_choice, serving_of, until_disconnect
from core.serving import embeddings

router = APIRouter()


@router.post("/embed", summary="TEI: dense embeddings", tags=["tei"])
async def tei_embed(body: schemas.TeiEmbedRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed(serving, model_choice(request), body.inputs, deadline=deadline_for(request, serving),
                            embedding_type="float", direction=body.truncation_direction, truncate=body.truncate,
                            normalize=body.normalize, dimensions=body.dimensions, prompt_name=body.prompt_name,
                            param="inputs")
    served = await until_disconnect(request, work)
    return JSONBytes(dumps(served.result.vectors))  # multi-vector models: a list of vectors per input


@router.post("/embed_all", summary="TEI: every token's embedding", tags=["tei"])
async def tei_embed_all(body: schemas.TeiEmbedAllRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed_all(serving, model_choice(request), body.inputs, truncate=body.truncate,
                                deadline=deadline_for(request, serving), prompt_name=body.prompt_name,
                                direction=body.truncation_direction)
    return JSONBytes(dumps((await until_disconnect(request, work)).result.vectors))


@router.post("/similarity", summary="TEI: cosine similarity of sentences to a source sentence", tags=["tei"])
async def tei_similarity(body: schemas.TeiSimilarityRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.similarity(serving, model_choice(request), body.inputs.source_sentence, body.inputs.sentences,
                                 deadline=deadline_for(request, serving), truncate=body.truncate,
                                 prompt_name=body.prompt_name, direction=body.truncation_direction)
    return JSONBytes(dumps((await until_disconnect(request, work)).result.scores))
