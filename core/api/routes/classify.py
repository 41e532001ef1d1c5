"""``POST /v1/classify`` (and ``/classify``, Infinity's shape): per input, labels with scores, best first."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, usage
from core.api.routes.common import JSONBytes, deadline_for, registry_of, serve_until_disconnect, settings_of
from core.api.routes.inputs import check_positive, response_id, text_list
from core.errors import InvalidInput
from core.tasks.classify import ClassifyRequest

router = APIRouter()


@router.post(
    "/v1/classify",
    response_model=protocol.ClassifyResponse,
    responses=protocol.ERROR_RESPONSES,
    summary="Classify texts (labels from the model's id2label)",
)
@router.post("/classify", include_in_schema=False)
async def classify(body: protocol.ClassifyRequest, request: Request) -> Response:
    settings = settings_of(request)
    engine = registry_of(request).get(body.model, "classify")
    texts = text_list(body.input, "input", settings)
    check_positive(body.top_k, "top_k")
    labels = engine.task.labels
    columns = list(range(len(labels)))
    if body.labels is not None:
        if not body.labels:
            raise InvalidInput("'labels' must not be empty", param="labels")
        unknown = [lab for lab in body.labels if lab not in labels]
        if unknown:
            raise InvalidInput(f"unknown labels {unknown}; this model's labels: {labels}", param="labels",
                               code="unknown_label")
        columns = [labels.index(lab) for lab in dict.fromkeys(body.labels)]
    task_request = ClassifyRequest(texts=texts, raw_scores=body.raw_scores, truncate=body.truncate)
    result = await serve_until_disconnect(request, engine(task_request, deadline=deadline_for(request, settings)))
    data = []
    for row in result.scores:
        sub = np.asarray(columns)
        order = sub[np.argsort(-row[sub], kind="stable")].tolist()
        if body.top_k is not None:
            order = order[: body.top_k]
        data.append([{"label": labels[j], "score": float(row[j])} for j in order])
    rid, created = response_id("classify")
    return JSONBytes(dumps({
        "object": "classify", "id": rid, "created": created, "data": data, "model": engine.name,
        "usage": usage(result.prompt_tokens),
    }))
