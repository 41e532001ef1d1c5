"""``POST /v1/embeddings/sparse``: the OpenAI embeddings request answered with sparse (SPLADE) vectors,
``{object: "list", data: [{object: "sparse_embedding", index, embedding: {indices, values, tokens?}}]}``.
A dedicated route (not an ``embedding_type`` on ``/v1/embeddings``) keeps ``/v1/embeddings``' items what
OpenAI clients expect: a list of floats or a base64 string."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ERROR_RESPONSES, dumps
from core.api.sparse import schemas
from core.api.sparse.encode import openai_sparse
from core.api.http import JSONBytes, deadline_for, serving_of, until_disconnect
from core.serving import embeddings

router = APIRouter()


@router.post("/v1/embeddings/sparse", response_model=schemas.SparseEmbeddingResponse,
             responses=ERROR_RESPONSES, summary="Sparse (SPLADE) embeddings")
@router.post("/embeddings/sparse", include_in_schema=False)
async def sparse_embeddings(body: schemas.SparseEmbeddingRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed_sparse(serving, body.model, body.input, truncate=body.truncate,
                                   deadline=deadline_for(request, serving))
    return JSONBytes(dumps(openai_sparse(await until_disconnect(request, work), body.return_tokens)))
