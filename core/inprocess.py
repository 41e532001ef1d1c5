"""The in-process API: Tessera's models from async Python code, without HTTP (as Infinity's
``AsyncEngineArray``). The same registry, batchers, limits and results as the server's routes::

    from core.inprocess import AsyncModels

    async with AsyncModels.from_env() as api:             # TESSERA_* settings, or AsyncModels(settings)
        vectors = await api.embed(["a text", "another"])              # float32 (n, d)
        scores = await api.rerank("a query", ["doc one", "doc two"])  # float32 (n,), input order
        labels, probs = await api.classify(["great!"])                 # label names, (n, labels)

Concurrent calls share each model's batcher (its token budget and queue), so a batch job may fire many
calls at once. Every call has the server's deadline (``request_timeout_s``) unless given one.
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from typing import Any, Mapping

import numpy as np

from core.config import Settings, settings_from_env
from core.engine import Registry
from core.serving import ServingContext, embeddings, ranking


class AsyncModels:
    """The served models (a ``Registry``: one ``Engine`` per model) behind the serving layer, in-process."""

    def __init__(self, settings: Settings, registry: Registry | None = None) -> None:
        """``registry``: models already loaded (a surface that built them, e.g. Modal's class); without
        one, ``async with`` loads them from ``settings`` and stops them at the end."""
        self.settings = settings
        self._registry = registry
        self._owns_registry = registry is None
        self._serving = ServingContext(settings, lambda: self._registry)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "AsyncModels":
        return cls(settings_from_env(os.environ if environ is None else environ, **overrides))

    async def __aenter__(self) -> "AsyncModels":
        if self._registry is None:
            self._registry = await asyncio.to_thread(Registry.from_settings, self.settings)
        await self._registry.ensure_started()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._owns_registry:
            await self._registry.stop(drain=True, timeout=self.settings.shutdown_grace_s)
        await self._serving.close()

    @property
    def models(self) -> list[str]:
        return sorted(self._serving.registry.engines)

    def _deadline(self, timeout_s: float | None) -> float:
        return time.monotonic() + (timeout_s or self.settings.request_timeout_s)

    async def embed(self, texts: list[str], model: str | None = None, *, timeout_s: float | None = None,
                    **options: Any) -> np.ndarray:
        """Dense vectors, one float32 row per text, in order; ``options`` as ``/v1/embeddings``' (normalize,
        dimensions, prompt, prompt_name, truncate, embedding_type, modality for image/audio inputs). A long
        list goes in requests of ``max_items_per_request`` texts, all queued at once."""
        deadline = self._deadline(timeout_s)
        await self._serving.registry.ensure_started()  # a given registry: its batchers, in this loop
        step = self.settings.max_items_per_request
        parts = await asyncio.gather(*(
            embeddings.embed(self._serving, model, texts[i:i + step], deadline=deadline, **options)
            for i in range(0, len(texts), step)
        ))
        if not parts:
            return np.zeros((0, 0), np.float32)
        vectors = [p.result.vectors for p in parts]
        return np.concatenate(vectors) if isinstance(vectors[0], np.ndarray) else [v for part in vectors for v in part]

    async def embed_messages(self, conversations: list[list[dict]], model: str | None = None, *,
                             timeout_s: float | None = None, **options: Any) -> np.ndarray:
        """Vision–language embedders: one vector per chat conversation (each as ``/v1/embeddings``' ``messages``:
        ``[{role, content}]``, content a string or text / image_url parts), in order; ``options`` as
        ``/v1/embeddings``' (normalize, dimensions, add_generation_prompt, continue_final_message). The
        conversations go as one request each, all queued at once."""
        deadline = self._deadline(timeout_s)
        await self._serving.registry.ensure_started()
        parts = await asyncio.gather(*(
            embeddings.embed(self._serving, model, None, messages=messages, deadline=deadline, **options)
            for messages in conversations
        ))
        if not parts:
            return np.zeros((0, 0), np.float32)
        return np.concatenate([p.result.vectors for p in parts])

    async def embed_sparse(self, texts: list[str], model: str | None = None, *, truncate: bool = True,
                           timeout_s: float | None = None) -> list:
        """Sparse vectors (``indices``, ``values``), one per text."""
        served = await embeddings.embed_sparse(self._serving, model, texts, truncate=truncate,
                                               deadline=self._deadline(timeout_s))
        return served.result.vectors

    async def rerank(self, query: str, documents: list[str], model: str | None = None, *,
                     raw_scores: bool = False, timeout_s: float | None = None) -> np.ndarray:
        """A score per document, in input order."""
        served, _ = await ranking.rerank(self._serving, model, query, documents, raw_scores=raw_scores,
                                         deadline=self._deadline(timeout_s))
        return served.result.scores

    async def classify(self, texts: list[str], model: str | None = None, *, raw_scores: bool = False,
                       timeout_s: float | None = None) -> tuple[list[str], np.ndarray]:
        """The model's labels and, per text, a score per label."""
        served, _ = await ranking.classify(self._serving, model, texts, raw_scores=raw_scores,
                                           deadline=self._deadline(timeout_s))
        return list(served.result.labels), served.result.scores


def __getattr__(name: str) -> Any:
    """``AsyncEngine``: the former name of :class:`AsyncModels` (it wraps a registry of engines, not one), kept for
    code that imports it; it warns."""
    if name == "AsyncEngine":
        warnings.warn("core.inprocess.AsyncEngine is now AsyncModels", DeprecationWarning, stacklevel=2)
        return AsyncModels
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
