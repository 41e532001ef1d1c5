"""``POST /v1/tokenize``: token ids, token strings and counts (untruncated), so clients can budget context
against the model's ``max_length``. Served by every text task."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ERROR_RESPONSES, dumps
from core.api.tokenize import schemas
from core.api.tokenize.encode import token_list
from core.api.http import JSONBytes, deadline_for, serving_of, until_disconnect
from core.capabilities import Capability
from core.serving import models

router = APIRouter()


@router.post("/v1/tokenize", response_model=schemas.TokenizeResponse, responses=ERROR_RESPONSES,
             summary="Tokenize texts with a model's tokenizer")
async def tokenize(body: schemas.TokenizeRequest, request: Request) -> Response:
    serving = serving_of(request)
    engine = serving.engine(body.model, Capability.TOKENIZE)
    work = models.tokenize(serving, engine, body.input, add_special_tokens=body.add_special_tokens,
                           deadline=deadline_for(request, serving))
    return JSONBytes(dumps(token_list(await until_disconnect(request, work))))
