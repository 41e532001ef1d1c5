"""Dense and sparse embeddings: the OpenAI ``input`` union → ``EmbedRequest`` → vectors (quantized when
asked), and the in-process path for batch jobs."""

from __future__ import annotations

from typing import Any

import numpy as np

from core.api.serving.context import Served, Serving
from core.api.serving.inputs import embedding_input, media_refs
from core.config import Settings
from core.engine import Engine
from core.errors import InvalidInput
from core.quantize import CALIBRATION_TEXTS, quantize, ranges_of
from core.tasks.embed import EmbedRequest, EmbedResult


def embed_request(settings: Settings, value: Any, *, modality: str = "text", truncate: bool = True,
                  normalize: bool | None = None, dimensions: int | None = None, prompt: str | None = None,
                  prompt_name: str | None = None, input_type: str | None = None, deadline: float | None = None,
                  param: str = "input") -> EmbedRequest:
    """Validate an ``input`` (the OpenAI union, or media references) within the limits; build the task's
    request. ``normalize=None``: the model's own default; ``dimensions`` 0 or None: the full vector."""
    dimensions = dimensions or None
    if modality != "text":
        from core.media import MediaFetcher, MediaLimits

        refs = media_refs(value, modality, settings, param)
        return EmbedRequest(
            modality=modality, inputs=refs, normalize=normalize, dimensions=dimensions, truncate=truncate,
            media=MediaFetcher(MediaLimits.from_settings(settings), deadline=deadline),
        )
    texts, token_ids = embedding_input(value, settings, param, prompt=prompt)
    return EmbedRequest(
        texts=texts, token_ids=token_ids, truncate=truncate, normalize=normalize, dimensions=dimensions,
        prompt=prompt, prompt_name=prompt_name, input_type=input_type,
    )


async def embed(serving: Serving, model: str | None, value: Any, *, deadline: float,
                embedding_type: str | None = None, **options: Any) -> Served:
    """``/v1/embeddings`` and TEI's ``/embed``: vectors as ``embedding_type`` asks (None: the model's
    ``embedding_dtype``); ``options`` are :func:`embed_request`'s keywords."""
    engine = serving.engine(model, "embeddings")
    task_request = embed_request(serving.settings, value, deadline=deadline, **options)
    result = await engine(task_request, deadline=deadline)
    embedding_type = embedding_type or engine.spec.embedding_dtype
    if embedding_type != "float":
        vectors = await quantized(serving, engine, task_request, result.vectors, embedding_type, deadline)
        result = EmbedResult(vectors=vectors, prompt_tokens=result.prompt_tokens)
    return Served(engine, result)


async def quantized(serving: Serving, engine: Engine, task_request: EmbedRequest, vectors, embedding_type: str,
                    deadline: float) -> np.ndarray:
    """``embedding_type`` int8/uint8/binary/ubinary (core/quantize.py); int8/uint8 ranges from the model's
    calibration set, embedded once per model and shaped as this request's vectors are."""
    if isinstance(vectors, list):
        raise InvalidInput(f"embedding_type {embedding_type!r} is offered for single-vector models only; "
                           f"{engine.name!r} returns multi-vector embeddings", param="embedding_type")
    ranges = None
    if embedding_type in ("int8", "uint8"):
        async def embed_calibration_set() -> np.ndarray:
            full = EmbedRequest(texts=list(CALIBRATION_TEXTS), normalize=False)
            return (await engine(full, deadline=deadline)).vectors

        calibration = await serving.calibration(engine).vectors(embed_calibration_set)
        ranges = ranges_of(engine.task.shape(calibration, task_request))
    return quantize(vectors, embedding_type, ranges)


async def embed_sparse(serving: Serving, model: str | None, value: Any, *, truncate: bool, deadline: float,
                       param: str = "input") -> Served:
    """``/v1/embeddings/sparse`` and TEI's ``/embed_sparse``: SPLADE vectors (a multi-output model answers
    with its sparse head)."""
    engine = serving.engine(model, "embeddings_sparse")
    texts, token_ids = embedding_input(value, serving.settings, param)
    task_request = EmbedRequest(texts=texts, token_ids=token_ids, truncate=truncate, output="sparse")
    return Served(engine, await engine(task_request, deadline=deadline))


async def embed_texts(serving: Serving, texts: list[str], model: str | None = None, *,
                      deadline: float | None = None) -> np.ndarray:
    """In-process API for batch jobs (no HTTP): float32 rows, one per text, in input order, through the
    model's batcher (its token budget and queue), a request's worth of texts at a time."""
    engine = serving.engine(model, "embeddings")
    await serving.registry.ensure_started()
    step = serving.settings.max_items_per_request
    parts = []
    for start in range(0, len(texts), step):
        task_request = embed_request(serving.settings, texts[start:start + step])
        parts.append((await engine(task_request, deadline=deadline)).vectors)
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
