"""The HTTP API's features, one package each (as vLLM's ``entrypoints/pooling/<feature>/``): a feature's
routes, wire schemas and answer encoders live together, with its peers' shapes of the same work beside its
own (``tei.py``, ``cohere.py``). Each package declares its :class:`~core.api.common.Feature`: the capability
its main route serves and the warm requests of a model that has it. Add a package here to add its routes to
every surface, its warm requests to the warm pass and its route to SageMaker's default route."""

from __future__ import annotations

from typing import Any, Iterable

from fastapi import APIRouter

from core.api import classify, embeddings, rerank, score, sparse, system, tokenize
from core.api.common import Feature
from core.capabilities import Capability

#: in the order their routes are added (and their warm requests sent)
FEATURES: tuple[Feature, ...] = tuple(package.FEATURE for package in (
    embeddings, system, sparse, rerank, classify, score, tokenize))

router = APIRouter()
for _feature in FEATURES:
    router.include_router(_feature.router)


def feature_for(capability: Capability | str) -> Feature:
    """The feature whose main route serves ``capability`` (``KeyError`` for one no route is named after:
    ``embed_all``, served by TEI's ``/embed_all`` only)."""
    for feature in FEATURES:
        if feature.capability == capability:
            return feature
    raise KeyError(capability)


def warm_bodies(name: str, capabilities: Iterable[str], modalities: Iterable[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(route, label, body)`` of each warm request of a model with ``capabilities``, feature by feature."""
    capabilities, modalities = set(capabilities), tuple(modalities)
    return [(feature.route, label, body) for feature in FEATURES
            if feature.warm is not None and feature.capability in capabilities
            for label, body in feature.warm(name, modalities)]
