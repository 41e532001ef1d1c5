"""Cohere v2's ``POST /v2/rerank`` (what ``cohere.ClientV2.rerank`` calls): ``{model, query, documents, top_n,
max_tokens_per_doc}`` → ``{id, results: [{index, relevance_score}], meta}``. Cohere v1's rerank shape is
``/v1/rerank``'s own (``routes.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ERROR_RESPONSES, dumps
from core.api.http import JSONBytes, deadline_for, serving_of, until_disconnect
from core.api.rerank import schemas
from core.api.rerank.encode import cohere_rerank
from core.serving import ranking

router = APIRouter()


@router.post("/v2/rerank", responses=ERROR_RESPONSES, summary="Rerank (Cohere v2 shape)", tags=["cohere"])
async def rerank_v2(body: schemas.CohereRerankRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = ranking.rerank(serving, body.model, body.query, body.documents, deadline=deadline_for(request, serving),
                          max_tokens_per_doc=body.max_tokens_per_doc, top_n=body.top_n,
                          instruction=body.instruction)
    served, texts = await until_disconnect(request, work)
    return JSONBytes(dumps(cohere_rerank(served, texts, body.top_n, body.return_documents)))
