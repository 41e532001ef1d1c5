"""TEI's ``POST /tokenize`` (token pieces with offsets) and ``POST /decode`` (token ids back to text); without
``?model=NAME`` the first served model answers (a TEI process serves one)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import dumps
from core.api.http import JSONBytes, deadline_for, model_choice, serving_of, until_disconnect
from core.api.tokenize import schemas
from core.api.tokenize.encode import tei_tokens
from core.capabilities import Capability
from core.serving import models

router = APIRouter()


@router.post("/tokenize", summary="TEI: tokenize", tags=["tei"])
async def tei_tokenize(body: schemas.TeiTokenizeRequest, request: Request) -> Response:
    serving = serving_of(request)
    engine = models.first_engine(serving, model_choice(request), Capability.TOKENIZE)
    work = models.tokenize(serving, engine, body.inputs, add_special_tokens=body.add_special_tokens,
                           deadline=deadline_for(request, serving), prompt_name=body.prompt_name, param="inputs")
    return JSONBytes(dumps(tei_tokens(await until_disconnect(request, work))))


@router.post("/decode", summary="TEI: token ids back to text", tags=["tei"])
async def tei_decode(body: schemas.TeiDecodeRequest, request: Request) -> Response:
    engine = models.first_engine(serving_of(request), model_choice(request), Capability.TOKENIZE)
    texts = models.decode(engine, body.ids, skip_special_tokens=body.skip_special_tokens).result
    return JSONBytes(dumps(texts))
