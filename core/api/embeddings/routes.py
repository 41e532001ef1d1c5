"""``POST /v1/embeddings`` (and ``/embeddings``): OpenAI semantics plus Tessera's extensions; Infinity's
``/embeddings_image`` and ``/embeddings_audio`` (what ``infinity_client`` calls for media): the same request,
its ``input`` URLs or data: URIs of that modality."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ERROR_RESPONSES
from core.api.embeddings import schemas
from core.api.embeddings.encode import openai_embeddings
from core.api.http import answer, deadline_for, serving_of, until_disconnect
from core.api.response_limit import refuse_unfit_embeddings
from core.serving import embeddings

router = APIRouter()


@router.post(
    "/v1/embeddings",
    response_model=schemas.EmbeddingResponse,
    responses=ERROR_RESPONSES,
    summary="Create embeddings (OpenAI-compatible)",
)
@router.post("/embeddings", include_in_schema=False)
async def create_embeddings(body: schemas.EmbeddingRequest, request: Request) -> Response:
    serving = serving_of(request)
    refuse_unfit_embeddings(request, body, serving.settings.max_items_per_request)
    work = embeddings.embed(
        serving, body.model, body.input, deadline=deadline_for(request, serving), embedding_type=body.embedding_type,
        modality=body.modality, truncate=body.truncate, normalize=body.normalize, dimensions=body.dimensions,
        prompt=body.prompt, prompt_name=body.prompt_name, input_type=body.input_type,
        chunking=body.chunking, late_chunking=body.late_chunking, task=body.task, messages=body.messages,
        add_generation_prompt=body.add_generation_prompt, continue_final_message=body.continue_final_message,
    )
    served = await until_disconnect(request, work)
    return answer(request, served, lambda: openai_embeddings(served, body.encoding_format))


@router.post("/embeddings_image", response_model=schemas.EmbeddingResponse, responses=ERROR_RESPONSES,
             summary="Infinity: image embeddings (input: http(s) URLs or data: URIs)", tags=["infinity"])
async def embeddings_image(body: schemas.EmbeddingRequest, request: Request) -> Response:
    return await create_embeddings(body.model_copy(update={"modality": "image"}), request)


@router.post("/embeddings_audio", response_model=schemas.EmbeddingResponse, responses=ERROR_RESPONSES,
             summary="Infinity: audio embeddings (input: http(s) URLs or data: URIs)", tags=["infinity"])
async def embeddings_audio(body: schemas.EmbeddingRequest, request: Request) -> Response:
    return await create_embeddings(body.model_copy(update={"modality": "audio"}), request)
