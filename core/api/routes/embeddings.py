"""``POST /v1/embeddings`` (and ``/embeddings``): OpenAI semantics plus Tessera's extensions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps, embedding_list
from core.api.routes.common import JSONBytes, deadline_for, registry_of, serve_until_disconnect, settings_of
from core.api.routes.inputs import check_count, check_prompt, check_texts
from core.config import Settings
from core.errors import InvalidInput
from core.quantize import CALIBRATION_TEXTS, Calibrations, quantize
from core.tasks.chunking import long_input_options
from core.tasks.embed import EmbedRequest

router = APIRouter()


def media_request(body: protocol.EmbeddingRequest, settings: Settings, deadline: float | None = None) -> EmbedRequest:
    """``modality: image | audio``: ``input`` holds media references; fetching happens in the task's prepare."""
    from core.media import MediaFetcher, MediaLimits

    value = body.input
    refs = [value] if isinstance(value, str) else value
    if not refs:
        raise InvalidInput("'input' must not be empty", param="input")
    for i, ref in enumerate(refs):
        if not isinstance(ref, str):
            raise InvalidInput(f"input[{i}]: {body.modality} input must be a data: URI or an http(s) URL string",
                               param="input")
    check_count(len(refs), settings, "input")
    return EmbedRequest(
        modality=body.modality, inputs=list(refs), normalize=body.normalize, dimensions=body.dimensions,
        truncate=body.truncate, media=MediaFetcher(MediaLimits.from_settings(settings), deadline=deadline),
    )


def embed_request(body: protocol.EmbeddingRequest, settings: Settings, deadline: float | None = None) -> EmbedRequest:
    """Validate the ``input`` union and limits; build the task's request."""
    if body.modality != "text":
        return media_request(body, settings, deadline)
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
    if texts is not None:
        check_texts(texts, settings, "input")
        check_prompt(body.prompt, texts, settings)
    else:
        check_count(len(token_ids), settings, "input")
    chunking, late_chunking = long_input_options(body.chunking, body.late_chunking)
    return EmbedRequest(
        texts=texts, token_ids=token_ids, truncate=body.truncate, normalize=body.normalize,
        dimensions=body.dimensions, prompt=body.prompt, prompt_name=body.prompt_name, input_type=body.input_type,
        chunking=chunking, late_chunking=late_chunking,
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
    deadline = deadline_for(request, settings)
    task_request = embed_request(body, settings, deadline)
    result = await serve_until_disconnect(request, engine(task_request, deadline=deadline))
    vectors = result.vectors
    embedding_type = body.embedding_type or engine.spec.embedding_dtype
    if embedding_type != "float":
        vectors = await quantized(request, engine, task_request, vectors, embedding_type, deadline)
    return JSONBytes(dumps(embedding_list(vectors, body.encoding_format, engine.name, result.prompt_tokens)))


async def quantized(request: Request, engine, task_request: EmbedRequest, vectors, embedding_type: str,
                    deadline: float):
    """``embedding_type`` int8/uint8/binary/ubinary (core/quantize.py); int8/uint8 calibrated per model."""
    if isinstance(vectors, list):
        raise InvalidInput(f"embedding_type {embedding_type!r} is offered for single-vector models only; "
                           f"{engine.name!r} returns multi-vector embeddings", param="embedding_type")
    ranges = None
    if embedding_type in ("int8", "uint8"):
        known = request.app.state.calibrations
        calibrations = known.get(engine.name) or known.setdefault(engine.name, Calibrations())
        key = (task_request.dimensions, task_request.normalize)

        async def embed_calibration_set():
            calib = EmbedRequest(texts=list(CALIBRATION_TEXTS), dimensions=task_request.dimensions,
                                 normalize=task_request.normalize)
            return (await engine(calib, deadline=deadline)).vectors

        ranges = await calibrations.ranges(key, embed_calibration_set)
    return quantize(vectors, embedding_type, ranges)
