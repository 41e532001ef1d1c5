"""Cohere's ``POST /v2/rerank`` (what ``cohere.ClientV2.rerank`` calls): ``{model, query, documents,
top_n, max_tokens_per_doc}`` → ``{id, results: [{index, relevance_score}], meta}``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps
from core.api.routes.common import JSONBytes, registry_of, settings_of
from core.api.routes.inputs import check_positive, document_texts, response_id
from core.api.routes.rerank import ranked, scores_for

router = APIRouter()


@router.post("/v2/rerank", responses=protocol.ERROR_RESPONSES, summary="Rerank (Cohere v2 shape)", tags=["cohere"])
async def cohere_rerank(body: protocol.CohereRerankRequest, request: Request) -> Response:
    engine = registry_of(request).get(body.model, "rerank")
    texts = document_texts(body.documents, settings_of(request))
    check_positive(body.top_n, "top_n")
    check_positive(body.max_tokens_per_doc, "max_tokens_per_doc")
    result = await scores_for(request, engine, body.query, texts, max_tokens_per_doc=body.max_tokens_per_doc,
                              instruction=body.instruction)
    results = []
    for j in ranked(result.scores, body.top_n):
        item = {"index": j, "relevance_score": float(result.scores[j])}
        if body.return_documents:
            item["document"] = {"text": texts[j]}
        results.append(item)
    rid, _ = response_id("rerank")
    return JSONBytes(dumps({
        "id": rid,
        "results": results,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
                 "tokens": {"input_tokens": result.prompt_tokens, "output_tokens": 0}},
    }))
