"""Dense and sparse embeddings: the OpenAI ``input`` union → ``EmbedRequest`` → vectors (quantized when
asked), and the in-process path for batch jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core.capabilities import Capability
from core.serving.context import Served, ServingContext
from core.serving.inputs import (chat_messages, check_late_chunking, embedding_input, media_refs, not_empty,
                                     truncation_direction)
from core.cache import cacheable
from core.config import Settings
from core.engine import Engine
from core.errors import InvalidInput
from core.quantize import CALIBRATION_TEXTS, quantize, ranges_of
from core.tasks.chunking import long_input_options
from core.tasks.embed import EmbedRequest, EmbedResult


def embed_request(settings: Settings, value: Any, *, modality: str = "text", truncate: bool = True,
                  normalize: bool | None = None, dimensions: int | None = None, prompt: str | None = None,
                  prompt_name: str | None = None, input_type: str | None = None, deadline: float | None = None,
                  param: str = "input", chunking: Any = None, late_chunking: Any = None,
                  task: str | None = None, messages: Any = None, add_generation_prompt: bool = False,
                  continue_final_message: bool = False) -> EmbedRequest:
    """Validate an ``input`` (the OpenAI union, or media references) or chat ``messages`` within the limits;
    build the task's request. ``normalize=None``: the model's own default; ``dimensions`` 0 or None: the full
    vector; ``task``: the model's task adapter (text only)."""
    dimensions = dimensions or None
    if (value is None) == (messages is None):
        raise InvalidInput("send exactly one of 'input' and 'messages'", param="input" if value is None else "messages")
    if messages is not None:
        options = {"modality": modality != "text", "task": task is not None, "prompt": prompt is not None,
                   "prompt_name": prompt_name is not None, "input_type": input_type is not None,
                   "chunking": bool(chunking), "late_chunking": bool(late_chunking)}
        for which, given in options.items():
            if given:
                raise InvalidInput(f"'{which}' does not apply to 'messages': the conversation says what it holds "
                                   "(an instruction goes in a system message)", param=which)
        conversation, refs = chat_messages(messages, settings, add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message)
        from core.media import MediaFetcher, MediaLimits

        media = MediaFetcher(MediaLimits.from_settings(settings), deadline=deadline)
        return EmbedRequest(conversations=[conversation], inputs=refs, normalize=normalize, dimensions=dimensions,
                            truncate=truncate, media=media)
    if modality != "text":
        from core.media import MediaFetcher, MediaLimits

        if task is not None:
            raise InvalidInput("'task' selects a text model's task adapter; it does not apply to "
                               f"{modality} input", param="task")

        refs = media_refs(value, modality, settings, param)
        return EmbedRequest(
            modality=modality, inputs=refs, normalize=normalize, dimensions=dimensions, truncate=truncate,
            media=MediaFetcher(MediaLimits.from_settings(settings), deadline=deadline),
        )
    texts, token_ids = embedding_input(value, settings, param, prompt=prompt)
    chunk, late = long_input_options(chunking, late_chunking)
    check_late_chunking(texts, late, settings)
    return EmbedRequest(
        texts=texts, token_ids=token_ids, truncate=truncate, normalize=normalize, dimensions=dimensions,
        prompt=prompt, prompt_name=prompt_name, input_type=input_type, chunking=chunk, late_chunking=late,
        task=task,
    )


async def embed(serving: ServingContext, model: str | None, value: Any, *, deadline: float,
                embedding_type: str | None = None, direction: str | None = None, **options: Any) -> Served:
    """``/v1/embeddings`` and TEI's ``/embed``: vectors as ``embedding_type`` asks (None: the model's
    ``embedding_dtype``); ``direction``: which end an over-long text loses (right by default);
    ``options`` are :func:`embed_request`'s keywords."""
    engine = serving.engine(model, Capability.EMBEDDINGS)
    task_request = embed_request(serving.settings, value, deadline=deadline, **options)
    if task_request.conversations is not None and not getattr(engine.task, "takes_messages", False):
        raise InvalidInput(f"'messages' (chat input) is offered for vision–language embedders; model {engine.name!r} "
                           "takes 'input'", param="messages")
    if task_request.task is not None and not getattr(engine.task, "adapters", ()):
        raise InvalidInput(f"'task' selects a task adapter (jina-embeddings-v3's LoRA tasks); model {engine.name!r} "
                           "has none", param="task")
    task_request.truncation_direction = truncation_direction(direction, engine.task)
    cache = serving.embedding_cache
    if cache is not None and cacheable(engine, task_request):
        result = await cache.embed(engine, task_request, deadline=deadline)
    else:
        result = await engine(task_request, deadline=deadline)
    embedding_type = embedding_type or engine.spec.embedding_dtype
    if embedding_type != "float":
        vectors = await quantized(serving, engine, task_request, result.vectors, embedding_type, deadline)
        result = EmbedResult(vectors=vectors, prompt_tokens=result.prompt_tokens)
    return Served(engine, result)


async def quantized(serving: ServingContext, engine: Engine, task_request: EmbedRequest, vectors, embedding_type: str,
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


async def embed_sparse(serving: ServingContext, model: str | None, value: Any, *, truncate: bool, deadline: float,
                       prompt_name: str | None = None, direction: str | None = None,
                       param: str = "input") -> Served:
    """``/v1/embeddings/sparse`` and TEI's ``/embed_sparse``: SPLADE vectors (a multi-output model answers
    with its sparse head)."""
    engine = serving.engine(model, Capability.EMBEDDINGS_SPARSE)
    texts, token_ids = embedding_input(value, serving.settings, param)
    task_request = EmbedRequest(texts=texts, token_ids=token_ids, truncate=truncate, output="sparse",
                                prompt_name=prompt_name,
                                truncation_direction=truncation_direction(direction, engine.task))
    return Served(engine, await engine(task_request, deadline=deadline))


async def embed_all(serving: ServingContext, model: str | None, value: Any, *, truncate: bool, deadline: float,
                    prompt_name: str | None = None, direction: str | None = None, param: str = "inputs") -> Served:
    """TEI's ``/embed_all``: every token's vector (the encoder's output, unpooled), per input."""
    engine = serving.engine(model, Capability.EMBED_ALL)
    task_request = embed_request(serving.settings, value, truncate=truncate, prompt_name=prompt_name, param=param)
    task_request.output = "tokens"
    task_request.truncation_direction = truncation_direction(direction, engine.task)
    return Served(engine, await engine(task_request, deadline=deadline))


async def similarity(serving: ServingContext, model: str | None, source: str, sentences: list[str], *, deadline: float,
                     truncate: bool = True, prompt_name: str | None = None, direction: str | None = None) -> Served:
    """TEI's ``/similarity`` (and the sentence-similarity task of Hugging Face's clients): the cosine
    of each sentence's embedding with the source sentence's, in order."""
    not_empty(sentences, "sentences")
    served = await embed(serving, model, [source, *sentences], deadline=deadline, embedding_type="float",
                         direction=direction, truncate=truncate, normalize=True, prompt_name=prompt_name,
                         param="inputs")
    vectors = served.result.vectors
    if isinstance(vectors, list):
        raise InvalidInput(f"{served.engine.name!r} returns multi-vector embeddings: /similarity needs one vector "
                           "per sentence", param="model")
    scores = (vectors[1:] @ vectors[0]).astype(np.float32)
    return Served(served.engine, SimilarityResult(scores, served.result.prompt_tokens))


@dataclass(frozen=True, slots=True)
class SimilarityResult:
    scores: np.ndarray  # float32 (n,)
    prompt_tokens: int


async def embed_by_types(serving: ServingContext, model: str | None, value: Any, types: list[str], *, deadline: float,
                         **options: Any) -> tuple[Served, dict[str, np.ndarray]]:
    """Cohere's ``embedding_types``: one forward pass, the vectors in each type asked for (``float``,
    ``base64`` = float32 bytes, and the quantized types)."""
    not_empty(types, "embedding_types")
    served = await embed(serving, model, value, deadline=deadline, embedding_type="float", **options)
    vectors = served.result.vectors
    shaped_as = EmbedRequest(normalize=options.get("normalize"), dimensions=options.get("dimensions") or None)
    out: dict[str, np.ndarray] = {}
    for kind in dict.fromkeys(types):
        if kind in ("float", "base64"):
            out[kind] = vectors
        else:
            out[kind] = await quantized(serving, served.engine, shaped_as, vectors, kind, deadline)
    return served, out
