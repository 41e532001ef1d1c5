"""``POST /v1/classify`` (and ``/classify``, Infinity's shape): per input, labels with scores, best first."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ERROR_RESPONSES, dumps
from core.api.classify import schemas
from core.api.classify.encode import classify_list
from core.api.http import JSONBytes, deadline_for, serving_of, until_disconnect
from core.serving import ranking

router = APIRouter()


@router.post(
    "/v1/classify",
    response_model=schemas.ClassifyResponse,
    responses=ERROR_RESPONSES,
    summary="Classify texts (labels from the model's id2label)",
)
@router.post("/classify", include_in_schema=False)
async def classify(body: schemas.ClassifyRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = ranking.classify(serving, body.model, body.input, deadline=deadline_for(request, serving),
                            labels=body.labels, top_k=body.top_k, raw_scores=body.raw_scores, truncate=body.truncate)
    served, columns = await until_disconnect(request, work)
    return JSONBytes(dumps(classify_list(served, columns, body.top_k)))
