"""TEI's ``POST /predict``: sequence classification of single texts or (text, text_pair) pairs, labels best
first (the one served classifier, or ``?model=NAME``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.classify import schemas
from core.api.classify.encode import tei_predict
from core.api.common import dumps
from core.api.http import JSONBytes, deadline_for, model_choice, serving_of, until_disconnect
from core.serving import ranking

router = APIRouter()


@router.post("/predict", summary="TEI: sequence classification", tags=["tei"])
async def tei_predict_route(body: schemas.TeiPredictRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = ranking.predict(serving, model_choice(request), body.inputs, deadline=deadline_for(request, serving),
                           raw_scores=body.raw_scores, truncate=body.truncate, direction=body.truncation_direction)
    served, single = await until_disconnect(request, work)
    return JSONBytes(dumps(tei_predict(served, single)))
