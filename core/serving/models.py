"""What the service says about its models (``/v1/models``, readiness, TEI's ``/info``), and tokenizing."""

from __future__ import annotations

import asyncio
import time

from core.serving.context import Served, ServingContext
from core.serving.inputs import check_prompt, not_empty, text_list
from core.capabilities import Capability
from core.config import Settings
from core.engine import Engine, Registry
from core.errors import NotReady, Timeout
from core.tasks.prompts import resolve_prompt


def card(engine: Engine) -> dict:
    """One ``/v1/models`` entry: OpenAI's fields, Infinity's (``stats``; its generated client accepts no
    ``owned_by`` but "infinity"), then what the engine describes of itself."""
    return {"id": engine.name, "object": "model", "created": 0, "owned_by": "infinity", "stats": {},
            **engine.describe()}


def cards(serving: ServingContext) -> list[dict]:
    return [card(e) for e in serving.registry.engines.values()]


def readiness(registry: Registry, draining: bool) -> dict:
    """``/ready``'s answer; raises ``NotReady`` (503) naming what is not ready."""
    models = {name: ("ready" if e.healthy else f"unhealthy: {e.last_error}") for name, e in registry.engines.items()}
    models.update({name: f"failed to load: {f.error}" for name, f in registry.failed.items()})
    if draining:
        raise NotReady("server is shutting down")
    if not registry.ready:
        bad = {k: v for k, v in models.items() if v != "ready"}
        raise NotReady(f"not ready: {bad or 'no models loaded'}")
    return {"status": "ready", "models": models}


def first_engine(serving: ServingContext, model: str | None, capability: Capability) -> Engine:
    """TEI's ``/tokenize`` and ``/info``: every text model has them; without a model name the first
    served model answers (a TEI process serves one)."""
    registry = serving.registry
    if model is None and registry.engines:
        model = next(iter(registry.engines))
    return registry.get(model, capability)


async def tokenize(serving: ServingContext, engine: Engine, inputs: str | list[str], *, add_special_tokens: bool,
                   deadline: float, prompt_name: str | None = None, param: str = "input") -> Served:
    """Untruncated token pieces per text, off the event loop, with the limits of the other routes: the
    texts' limits, tokens per request (413), the deadline (504). ``prompt_name``: tokenized as the
    model would see ``prompt + text``."""
    texts = text_list(inputs, param, serving.settings)
    if prompt_name is not None:
        prompt = resolve_prompt(engine.task.info, engine.spec, None, prompt_name) or ""
        check_prompt(prompt, texts, serving.settings)
        texts = [prompt + t for t in texts]
    work = asyncio.to_thread(engine.task.tokenizer.pieces, texts, add_special_tokens=add_special_tokens,
                             max_tokens=serving.settings.max_tokens_per_request)
    try:
        pieces = await asyncio.wait_for(work, max(deadline - time.monotonic(), 0.0))
    except TimeoutError:
        raise Timeout("the request's deadline passed while tokenizing") from None
    return Served(engine, pieces)


def decode(engine: Engine, ids: list[int] | list[list[int]], *, skip_special_tokens: bool) -> Served:
    """TEI's ``/decode``: the text of one token-id sequence, or of each of several."""
    sequences = [ids] if ids and isinstance(ids[0], int) else ids
    not_empty(sequences, "ids")
    texts = engine.task.tokenizer.decode(sequences, skip_special_tokens=skip_special_tokens)
    return Served(engine, texts)


def tei_model_type(engine: Engine) -> dict:
    task = engine.task
    if task.name in ("rerank", "classify"):
        labels = task.score_labels()
        kind = "reranker" if task.name == "rerank" else "classifier"
        return {kind: {"id2label": {str(i): lab for i, lab in enumerate(labels)},
                       "label2id": {lab: i for i, lab in enumerate(labels)}}}
    if task.name == "sparse":
        return {"embedding": {"pooling": "splade"}}
    # the pooling in force (the spec's `pooling` override included), as the task describes it
    return {"embedding": {"pooling": task.describe().get("pooling") or task.info.pooling}}


def tei_info(engine: Engine, settings: Settings, version: str) -> dict:
    """TEI's ``/info`` for one engine."""
    spec = engine.spec
    return {
        "model_id": engine.name,
        "model_sha": engine.model_sha,
        "model_dtype": spec.dtype,
        "model_type": tei_model_type(engine),
        "max_concurrent_requests": spec.max_queue_items,
        "max_input_length": engine.task.info.max_length,
        "max_batch_tokens": spec.batch_tokens,
        "max_batch_requests": engine.max_batch_size,  # the effective limit (a compiled backend's own)
        "max_client_batch_size": settings.max_items_per_request,
        "auto_truncate": True,
        "tokenization_workers": settings.tokenizing_threads,
        "version": version,
        "backend": engine.backend.describe().get("backend"),
        "task": engine.task.name,
        "capabilities": sorted(engine.task.capabilities),
    }
