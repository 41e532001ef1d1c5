"""``POST /v1/tokenize``: token ids, token strings and counts (untruncated), so clients can budget context
against the model's ``max_length``. Served by every text task."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, usage
from core.api.routes.common import JSONBytes, registry_of, settings_of, tokenize_pieces
from core.api.routes.inputs import text_list

router = APIRouter()


@router.post("/v1/tokenize", response_model=protocol.TokenizeResponse, responses=protocol.ERROR_RESPONSES,
             summary="Tokenize texts with a model's tokenizer")
async def tokenize(body: protocol.TokenizeRequest, request: Request) -> Response:
    engine = registry_of(request).get(body.model, "tokenize")
    texts = text_list(body.input, "input", settings_of(request))
    tokenizer = engine.task.tokenizer
    rows = await tokenize_pieces(request, tokenizer, texts, add_special_tokens=body.add_special_tokens)
    data = [
        {"object": "tokens", "index": i, "ids": [p.id for p in row], "tokens": [p.text for p in row], "count": len(row)}
        for i, row in enumerate(rows)
    ]
    total = sum(len(row) for row in rows)
    return JSONBytes(dumps({"object": "list", "data": data, "model": engine.name,
                            "max_length": tokenizer.max_length, "usage": usage(total)}))
