"""``POST /v1/embeddings`` (and ``/embeddings``): OpenAI semantics plus Tessera's extensions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, embedding_list, multi_vector_list
from core.api.routes.common import JSONBytes, deadline_for, registry_of, serve_until_disconnect, settings_of
from core.config import Settings
from core.errors import InvalidInput, TooLarge
from core.tasks.embed import EmbedRequest

router = APIRouter()


def embed_request(body: protocol.EmbeddingRequest, settings: Settings) -> EmbedRequest:
    """Validate the ``input`` union and limits; build the task's request."""
    value = body.input
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    if isinstance(value, str):
        texts = [value]
    elif not value:
        raise InvalidInput("'input' must not be empty", param="input")
    elif isinstance(value[0], str):
        texts = value  # type: ignore[assignment]
    elif isinstance(value[0], int):
        token_ids = [value]  # type: ignore[list-item]
    else:
        token_ids = value  # type: ignore[assignment]
    count = len(texts if texts is not None else token_ids)
    if count > settings.max_items_per_request:
        raise TooLarge(
            f"{count} inputs in one request; the limit is {settings.max_items_per_request}", param="input"
        )
    if texts is not None:
        limit = settings.max_chars_per_item
        for i, text in enumerate(texts):
            if len(text) > limit:
                raise TooLarge(f"input[{i}] has {len(text)} characters; the limit is {limit}", param="input")
    return EmbedRequest(
        texts=texts, token_ids=token_ids, truncate=body.truncate, normalize=body.normalize,
        dimensions=body.dimensions, prompt=body.prompt, prompt_name=body.prompt_name, input_type=body.input_type,
    )


@router.post(
    "/v1/embeddings",
    response_model=protocol.EmbeddingResponse,
    responses=protocol.ERROR_RESPONSES,
    summary="Create embeddings (OpenAI-compatible)",
)
@router.post("/embeddings", include_in_schema=False)
async def create_embeddings(body: protocol.EmbeddingRequest, request: Request) -> Response:
    settings = settings_of(request)
    engine = registry_of(request).get(body.model, "embeddings")
    task_request = embed_request(body, settings)
    result = await serve_until_disconnect(request, engine(task_request, deadline=deadline_for(request, settings)))
    if result.multi is not None:  # multi-vector (late interaction): a list of vectors per input
        return JSONBytes(dumps(multi_vector_list(result.multi, body.encoding_format, engine.name, result.prompt_tokens)))
    return JSONBytes(dumps(embedding_list(result.vectors, body.encoding_format, engine.name, result.prompt_tokens)))
