"""What a serving function takes and what it gives: ``ServingContext`` (the settings, the registry, per-model
caches), and ``Served`` (the task's result with the engine that produced it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from core.cache import EmbeddingCache, build_cache
from core.capabilities import Capability
from core.config import Settings
from core.engine import Engine, Registry
from core.errors import NotReady
from core.metrics import Metrics
from core.quantize import Calibration


#: what Infinity's generated client sends as ``model`` when the caller names none
UNSPECIFIED_MODEL = "default/not-specified"


@dataclass(frozen=True, slots=True)
class Served:
    """A task's result with the engine that produced it (encoders need its name, labels, tokenizer)."""

    engine: Engine
    result: Any


class ServingContext:
    """What every serving function takes first: one per app (or per in-process surface). The registry is read through ``registry_source`` because
    an app's lifespan loads the models after the app is built."""

    def __init__(self, settings: Settings, registry_source: Callable[[], Registry | None], *,
                 metrics: Metrics | None = None, embedding_cache: EmbeddingCache | None = None):
        """``embedding_cache``: one given (shared with another surface); else ``settings.embedding_cache``'s."""
        self.settings = settings
        self._registry_source = registry_source
        #: finished text embeddings by model identity, options and text (core/cache; None: off)
        self.embedding_cache = embedding_cache if embedding_cache is not None else build_cache(settings, metrics)
        #: served name → the model's int8/uint8 calibration (core/quantize.py), embedded on first use
        self._calibrations: dict[str, Calibration] = {}

    @classmethod
    def of(cls, settings: Settings, registry: Registry) -> "ServingContext":
        """For a surface that already holds its loaded registry (Lambda, Modal's bulk path)."""
        return cls(settings, lambda: registry)

    @property
    def registry(self) -> Registry:
        registry = self._registry_source()
        if registry is None:
            raise NotReady("models are still loading")
        return registry

    def engine(self, model: str | None, capability: Capability) -> Engine:
        """The engine for a request's ``model`` (None, "" or Infinity's client default: the one that fits)."""
        return self.registry.get(None if model == UNSPECIFIED_MODEL else model, capability)

    def calibration(self, engine: Engine) -> Calibration:
        known = self._calibrations.get(engine.name)
        if known is None:
            known = self._calibrations.setdefault(engine.name, Calibration())
        return known

    async def close(self) -> None:
        """Let go of what the surface holds beyond the registry (the embedding cache's connections)."""
        if self.embedding_cache is not None:
            await self.embedding_cache.close()
