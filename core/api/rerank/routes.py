"""``POST /v1/rerank`` and ``/rerank``: Infinity's and Cohere v1's shape (``documents``). A body that sends
TEI's ``texts`` instead of ``documents`` is TEI's ``/rerank`` and gets TEI's answer."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ERROR_RESPONSES, dumps
from core.api.rerank import schemas
from core.api.rerank.encode import rerank_list, tei_rerank
from core.api.http import JSONBytes, deadline_for, model_choice, serving_of, until_disconnect
from core.serving import ranking

router = APIRouter()


@router.post(
    "/v1/rerank",
    response_model=schemas.RerankResponse,
    responses=ERROR_RESPONSES,
    summary="Rerank documents against a query (Infinity / Cohere shape)",
)
@router.post("/rerank", include_in_schema=False)
async def rerank(body: schemas.RerankRequest, request: Request) -> Response:
    serving = serving_of(request)
    deadline = deadline_for(request, serving)
    if body.documents is None and body.texts is not None:  # TEI's body (its model is chosen by ?model=)
        work = ranking.rerank(serving, body.model or model_choice(request), body.query, body.texts,
                              deadline=deadline, raw_scores=body.raw_scores, truncate=body.truncate,
                              direction=body.truncation_direction, param="texts", instruction=body.instruction)
        served, texts = await until_disconnect(request, work)
        return JSONBytes(dumps(tei_rerank(served, texts, body.return_text)))
    work = ranking.rerank(serving, body.model, body.query, body.documents, deadline=deadline,
                          raw_scores=body.raw_scores, truncate=body.truncate,
                          max_tokens_per_doc=body.max_tokens_per_doc, top_n=body.top_n,
                          instruction=body.instruction)
    served, _ = await until_disconnect(request, work)
    return JSONBytes(dumps(rerank_list(served, body.documents, body.top_n, body.return_documents)))
