"""``POST /v1/score``: late-interaction (ColBERT MaxSim) scores of ``documents`` against ``query``,
computed server-side, in input order: ``{object: "list", data: [{object: "score", index, score}]}``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ERROR_RESPONSES, dumps
from core.api.score import schemas
from core.api.score.encode import score_list
from core.api.http import JSONBytes, deadline_for, serving_of, until_disconnect
from core.serving import ranking

router = APIRouter()


@router.post("/v1/score", response_model=schemas.ScoreResponse, responses=ERROR_RESPONSES,
             summary="MaxSim scores of documents against a query (multi-vector models)")
@router.post("/score", include_in_schema=False)
async def score(body: schemas.ScoreRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = ranking.maxsim(serving, body.model, body.query, body.documents, truncate=body.truncate,
                         deadline=deadline_for(request, serving))
    return JSONBytes(dumps(score_list(await until_disconnect(request, work))))
