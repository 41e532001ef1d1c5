"""Cohere's routes: ``POST /v1/embed`` (what the v1 ``cohere.Client.embed`` calls: without ``embedding_types``
the answer is v1's ``embeddings_floats``, ``{id, embeddings: [[...]], texts, meta}``), and the v2 ones, what
``cohere.ClientV2`` calls: ``POST /v2/rerank`` (``{model, query, documents,
top_n, max_tokens_per_doc}`` → ``{id, results: [{index, relevance_score}], meta}``) and ``POST /v2/embed``
(``{model, texts | images, input_type, embedding_types, truncate, output_dimension}`` →
``{id, embeddings: {float: [...], int8: [...], ...}, texts, meta}``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import cohere_embed, cohere_rerank, dumps
from core.api.http import JSONBytes, deadline_for, serving_of, until_disconnect
from core.api.serving import embeddings, ranking
from core.errors import InvalidInput

router = APIRouter()


@router.post("/v2/rerank", responses=protocol.ERROR_RESPONSES, summary="Rerank (Cohere v2 shape)", tags=["cohere"])
async def rerank_v2(body: protocol.CohereRerankRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = ranking.rerank(serving, body.model, body.query, body.documents, deadline=deadline_for(request, serving),
                          max_tokens_per_doc=body.max_tokens_per_doc, top_n=body.top_n,
                          instruction=body.instruction)
    served, texts = await until_disconnect(request, work)
    return JSONBytes(dumps(cohere_rerank(served, texts, body.top_n, body.return_documents)))


#: Cohere's ``truncate``: NONE refuses over-long input, END keeps the start, START keeps the end
_TRUNCATE = {None: (True, "right"), "END": (True, "right"), "START": (True, "left"), "NONE": (False, "right")}


@router.post("/v2/embed", responses=protocol.ERROR_RESPONSES, summary="Embed (Cohere v2 shape)", tags=["cohere"])
async def embed_v2(body: protocol.CohereEmbedRequest, request: Request) -> Response:
    return await _embed(body, request, version=2)


@router.post("/v1/embed", responses=protocol.ERROR_RESPONSES, summary="Embed (Cohere v1 shape)", tags=["cohere"])
async def embed_v1(body: protocol.CohereEmbedRequest, request: Request) -> Response:
    return await _embed(body, request, version=1)


async def _embed(body: protocol.CohereEmbedRequest, request: Request, *, version: int) -> Response:
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
