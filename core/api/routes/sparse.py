"""``POST /v1/embeddings/sparse``: the OpenAI embeddings request answered with sparse (SPLADE) vectors,
``{object: "list", data: [{object: "sparse_embedding", index, embedding: {indices, values, tokens?}}]}``.
A dedicated route (not an ``embedding_type`` on ``/v1/embeddings``) keeps ``/v1/embeddings``' items what
OpenAI clients expect: a list of floats or a base64 string."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, sparse_list
from core.api.routes.common import JSONBytes, deadline_for, registry_of, serve_until_disconnect, settings_of
from core.api.routes.embeddings import embed_request

router = APIRouter()


@router.post("/v1/embeddings/sparse", response_model=protocol.SparseEmbeddingResponse,
             responses=protocol.ERROR_RESPONSES, summary="Sparse (SPLADE) embeddings")
@router.post("/embeddings/sparse", include_in_schema=False)
async def sparse_embeddings(body: protocol.SparseEmbeddingRequest, request: Request) -> Response:
    settings = settings_of(request)
    engine = registry_of(request).get(body.model, "embeddings_sparse")
    task_request = embed_request(protocol.EmbeddingRequest(input=body.input, truncate=body.truncate), settings)
    task_request.output = "sparse"  # a multi-output model (BGE-M3) answers with its sparse head
    result = await serve_until_disconnect(request, engine(task_request, deadline=deadline_for(request, settings)))
    tokens_of = engine.task.token_strings if body.return_tokens else None
    return JSONBytes(dumps(sparse_list(result.vectors, engine.name, result.prompt_tokens, tokens_of)))
