"""``POST /v1/rerank`` and ``/rerank``: Infinity's and Cohere v1's shape (``documents``). A body that sends
TEI's ``texts`` instead of ``documents`` is TEI's ``/rerank`` and gets TEI's answer (``core/api/routes/tei.py``)."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, usage
from core.api.routes.common import JSONBytes, deadline_for, registry_of, serve_until_disconnect, settings_of
from core.api.routes.inputs import check_positive, document_texts, response_id
from core.api.routes.tei import tei_rerank
from core.tasks.rerank import RerankRequest

router = APIRouter()


async def scores_for(request: Request, engine, query: str, texts: list[str], *, raw_scores: bool = False,
                     truncate: bool = True, max_tokens_per_doc: int | None = None, instruction: str | None = None):
    settings = settings_of(request)
    task_request = RerankRequest(query=query, documents=texts, raw_scores=raw_scores, truncate=truncate,
                                 max_tokens_per_doc=max_tokens_per_doc, instruction=instruction)
    return await serve_until_disconnect(request, engine(task_request, deadline=deadline_for(request, settings)))


def ranked(scores: np.ndarray, top_n: int | None) -> list[int]:
    """Indices by descending score (ties keep input order), cut to ``top_n``."""
    order = np.argsort(-scores, kind="stable").tolist()
    return order[:top_n] if top_n is not None else order


@router.post(
    "/v1/rerank",
    response_model=protocol.RerankResponse,
    responses=protocol.ERROR_RESPONSES,
    summary="Rerank documents against a query (Infinity / Cohere shape)",
)
@router.post("/rerank", include_in_schema=False)
async def rerank(body: protocol.RerankRequest, request: Request) -> Response:
    if body.documents is None and body.texts is not None:
        return await tei_rerank(body, request)
    engine = registry_of(request).get(body.model, "rerank")
    texts = document_texts(body.documents, settings_of(request))
    check_positive(body.top_n, "top_n")
    check_positive(body.max_tokens_per_doc, "max_tokens_per_doc")
    result = await scores_for(request, engine, body.query, texts, raw_scores=body.raw_scores,
                              truncate=body.truncate, max_tokens_per_doc=body.max_tokens_per_doc,
                              instruction=body.instruction)
    results = []
    for j in ranked(result.scores, body.top_n):
        item = {"index": j, "relevance_score": float(result.scores[j])}
        if body.return_documents:
            item["document"] = body.documents[j]
        results.append(item)
    rid, created = response_id("rerank")
    return JSONBytes(dumps({
        "object": "rerank", "id": rid, "created": created, "results": results, "model": engine.name,
        "usage": usage(result.prompt_tokens),
    }))
