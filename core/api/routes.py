"""HTTP handlers: translate protocol models into task requests, call the engine, encode the reply."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, embedding_list
from core.config import Settings
from core.engine import Registry
from core.errors import InvalidInput, NotReady, TesseraError, TooLarge
from core.tasks.embed import EmbedRequest

router = APIRouter()

TIMEOUT_HEADER = "x-request-timeout"


class ClientClosed(TesseraError):
    """The client went away before its answer was ready (nginx's 499); nobody reads this response."""

    status, type, code = 499, "invalid_request_error", "client_closed_request"


class JSONBytes(Response):
    media_type = "application/json"


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _registry(request: Request) -> Registry:
    registry = request.app.state.registry
    if registry is None:
        raise NotReady("models are still loading")
    return registry


def deadline_for(request: Request, settings: Settings) -> float:
    """The request's deadline: the server's timeout, shortened by an ``X-Request-Timeout`` header (seconds)."""
    timeout = settings.request_timeout_s
    header = request.headers.get(TIMEOUT_HEADER)
    if header is not None:
        try:
            asked = float(header)
        except ValueError:
            raise InvalidInput(f"{TIMEOUT_HEADER} must be a number of seconds, got {header!r}") from None
        if not asked > 0:
            raise InvalidInput(f"{TIMEOUT_HEADER} must be positive, got {header!r}")
        timeout = min(timeout, asked)
    return time.monotonic() + timeout


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def serve_until_disconnect(request: Request, work):
    """Await ``work``; if the client disconnects first, cancel it (its queued items are then dropped)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise ClientClosed("client disconnected")
    return task.result()


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
        dimensions=body.dimensions,
    )


@router.post(
    "/v1/embeddings",
    response_model=protocol.EmbeddingResponse,
    responses=protocol.ERROR_RESPONSES,
    summary="Create embeddings (OpenAI-compatible)",
)
@router.post("/embeddings", include_in_schema=False)
async def create_embeddings(body: protocol.EmbeddingRequest, request: Request) -> Response:
    settings = _settings(request)
    engine = _registry(request).get(body.model, "embed")
    task_request = embed_request(body, settings)
    result = await serve_until_disconnect(request, engine(task_request, deadline=deadline_for(request, settings)))
    return JSONBytes(dumps(embedding_list(result.vectors, body.encoding_format, engine.name, result.prompt_tokens)))


@router.get("/v1/models", response_model=protocol.ModelList, summary="List served models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request) -> Response:
    return JSONBytes(dumps({"object": "list", "data": _registry(request).cards()}))


@router.get("/health", summary="Liveness: the process answers")
async def health() -> Response:
    return JSONBytes(b'{"status":"ok"}')


@router.get("/ready", summary="Readiness: every model loaded and healthy", responses={503: {"model": protocol.ErrorResponse}})
async def ready(request: Request) -> Response:
    registry = _registry(request)
    models = {name: ("ready" if e.healthy else f"unhealthy: {e.last_error}") for name, e in registry.engines.items()}
    models.update({name: f"failed to load: {f.error}" for name, f in registry.failed.items()})
    if request.app.state.draining:
        raise NotReady("server is shutting down")
    if not registry.ready:
        bad = {k: v for k, v in models.items() if v != "ready"}
        raise NotReady(f"not ready: {bad or 'no models loaded'}")
    return JSONBytes(dumps({"status": "ready", "models": models}))


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    m = request.app.state.metrics
    registry = request.app.state.registry
    if registry is not None:
        for name, engine in registry.engines.items():
            m.queue_depth.labels(name).set(engine.batcher.depth)
    return Response(m.render(), media_type=m.content_type)
