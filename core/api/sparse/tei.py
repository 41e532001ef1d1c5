"""TEI's ``POST /embed_sparse``: per input a list of ``{index, value}`` (the one served sparse model, or
``?model=NAME``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import dumps
from core.api.http import JSONBytes, deadline_for, model_choice, serving_of, until_disconnect
from core.api.sparse import schemas
from core.api.sparse.encode import tei_sparse
from core.serving import embeddings

router = APIRouter()


@router.post("/embed_sparse", summary="TEI: sparse embeddings", tags=["tei"])
async def tei_embed_sparse(body: schemas.TeiSparseRequest, request: Request) -> Response:
    serving = serving_of(request)
    work = embeddings.embed_sparse(serving, model_choice(request), body.inputs, truncate=body.truncate,
                                   deadline=deadline_for(request, serving), prompt_name=body.prompt_name,
                                   direction=body.truncation_direction, param="inputs")
    return JSONBytes(dumps(tei_sparse((await until_disconnect(request, work)).result.vectors)))
