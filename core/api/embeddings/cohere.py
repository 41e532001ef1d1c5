"""Cohere's embed routes: ``POST /v1/embed`` (what the v1 ``cohere.Client.embed`` calls: without
``embedding_types`` the answer is v1's ``embeddings_floats``, ``{id, embeddings: [[...]], texts, meta}``) and
``POST /v2/embed``, what ``cohere.ClientV2.embed`` calls (``{model, texts | images, input_type, embedding_types,
truncate, output_dimension}`` → ``{id, embeddings: {float: [...], int8: [...], ...}, texts, meta}``). Cohere's
``/v2/rerank`` is the rerank feature's (``core/api/rerank/cohere.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ERROR_RESPONSES, dumps
from core.api.embeddings import schemas
from core.api.embeddings.encode import cohere_embed
from core.api.http import JSONBytes, deadline_for, serving_of, until_disconnect
from core.errors import InvalidInput
from core.serving import embeddings

router = APIRouter()


#: Cohere's ``truncate``: NONE refuses over-long input, END keeps the start, START keeps the end
_TRUNCATE = {None: (True, "right"), "END": (True, "right"), "START": (True, "left"), "NONE": (False, "right")}


@router.post("/v2/embed", responses=ERROR_RESPONSES, summary="Embed (Cohere v2 shape)", tags=["cohere"])
async def embed_v2(body: schemas.CohereEmbedRequest, request: Request) -> Response:
    return await _embed(body, request, version=2)


@router.post("/v1/embed", responses=ERROR_RESPONSES, summary="Embed (Cohere v1 shape)", tags=["cohere"])
async def embed_v1(body: schemas.CohereEmbedRequest, request: Request) -> Response:
    return await _embed(body, request, version=1)


async def _embed(body: schemas.CohereEmbedRequest, request: Request, *, version: int) -> Response:
    serving = serving_of(request)
    if (body.texts is None) == (body.images is None):
        raise InvalidInput("send either 'texts' or 'images' (data: URIs)", param="texts")
    if body.max_tokens is not None:
        raise InvalidInput("max_tokens is not offered: inputs are cut at the model's max length "
                           "(see /v1/models 'max_length'), or refused with truncate=NONE", param="max_tokens")
    truncate, direction = _TRUNCATE[body.truncate]
    modality, value = ("text", body.texts) if body.texts is not None else ("image", body.images)
    work = embeddings.embed_by_types(
        serving, body.model, value, body.embedding_types or ["float"], deadline=deadline_for(request, serving),
        modality=modality, truncate=truncate, direction=direction if modality == "text" else None,
        dimensions=body.output_dimension, input_type=body.input_type if modality == "text" else None,
    )
    served, by_type = await until_disconnect(request, work)
    floats_only = version == 1 and body.embedding_types is None  # v1's embeddings_floats
    return JSONBytes(dumps(cohere_embed(served, by_type, body.texts, version=version, floats_only=floats_only)))
