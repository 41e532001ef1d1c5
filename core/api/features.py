"""The HTTP API's features, one package each (as vLLM's ``entrypoints/pooling/<feature>/``): a feature's
routes, wire schemas and answer encoders live together, with its peers' shapes of the same work beside its
own (``tei.py``, ``cohere.py``). Each package declares its :class:`~core.api.common.Feature`: the capability
its main route serves and the warm requests of a model that has it. Add a package here to add its routes to
every surface, its warm requests to the warm pass and its route to SageMaker's default route."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from fastapi import APIRouter
from starlette.routing import BaseRoute

from core.api import classify, embeddings, rerank, score, sparse, system, tokenize
from core.api.common import Feature
from core.capabilities import Capability

#: in the order their routes are added (and their warm requests sent)
FEATURES: tuple[Feature, ...] = tuple(package.FEATURE for package in (
    embeddings, system, sparse, rerank, classify, score, tokenize))


def leaf_routes(router: APIRouter) -> Iterator[BaseRoute]:
    """``router``'s routes with every router it includes opened up, in order. The features' routers include
    their modules' routers with nothing added (no prefix, tag or dependency), so their routes can stand
    side by side in one router: each level of inclusion is another match over its routes on every request."""
    for route in router.routes:
        inner = getattr(route, "original_router", None)  # FastAPI keeps an included router as one route
        if inner is not None:
            yield from leaf_routes(inner)
        else:
            yield route


#: every feature's routes in one flat router (the app includes it once)
router = APIRouter()
router.routes.extend(route for feature in FEATURES for route in leaf_routes(feature.router))


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
