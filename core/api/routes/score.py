"""``POST /v1/score``: late-interaction (ColBERT MaxSim) scores of ``documents`` against ``query``,
computed server-side, in input order: ``{object: "list", data: [{object: "score", index, score}]}``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, usage
from core.api.routes.common import JSONBytes, deadline_for, registry_of, serve_until_disconnect, settings_of
from core.api.routes.inputs import document_texts
from core.tasks.late_interaction import ScoreRequest

router = APIRouter()


@router.post("/v1/score", response_model=protocol.ScoreResponse, responses=protocol.ERROR_RESPONSES,
             summary="MaxSim scores of documents against a query (multi-vector models)")
@router.post("/score", include_in_schema=False)
async def score(body: protocol.ScoreRequest, request: Request) -> Response:
    settings = settings_of(request)
    engine = registry_of(request).get(body.model, "score")
    texts = document_texts(body.documents, settings)
    task_request = ScoreRequest(query=body.query, documents=texts, truncate=body.truncate)
    result = await serve_until_disconnect(request, engine(task_request, deadline=deadline_for(request, settings)))
    data = [{"object": "score", "index": i, "score": float(s)} for i, s in enumerate(result.scores)]
    return JSONBytes(dumps({"object": "list", "data": data, "model": engine.name, "usage": usage(result.prompt_tokens)}))
