"""Reranking: ``/v1/rerank`` and ``/rerank`` (Infinity, Cohere v1 and TEI's bodies: ``routes.py``) and
Cohere v2's ``/v2/rerank`` (``cohere.py``), their schemas and answers. The work itself:
``core.serving.ranking.rerank``."""

from __future__ import annotations

from fastapi import APIRouter

from core.api.common import Feature, WARM_TEXT
from core.api.rerank import cohere, routes
from core.capabilities import Capability


def _warm(name: str, modalities: tuple[str, ...]) -> list[tuple[str, dict]]:
    return [("rerank", {"model": name, "query": WARM_TEXT, "documents": [WARM_TEXT]})]


router = APIRouter()
for _module in (routes, cohere):
    router.include_router(_module.router)

FEATURE = Feature(router, capability=Capability.RERANK, route="/v1/rerank", warm=_warm)
