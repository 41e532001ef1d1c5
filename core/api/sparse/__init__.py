"""Sparse (SPLADE) embeddings: ``/v1/embeddings/sparse`` (``routes.py``) and TEI's ``/embed_sparse``
(``tei.py``), their schemas and answers. The work itself: ``core.serving.embeddings.embed_sparse``."""

from __future__ import annotations

from fastapi import APIRouter

from core.api.common import Feature, WARM_TEXT
from core.api.sparse import routes, tei
from core.capabilities import Capability


def _warm(name: str, modalities: tuple[str, ...]) -> list[tuple[str, dict]]:
    return [("sparse embeddings", {"model": name, "input": WARM_TEXT})]


router = APIRouter()
for _module in (routes, tei):
    router.include_router(_module.router)

FEATURE = Feature(router, capability=Capability.EMBEDDINGS_SPARSE, route="/v1/embeddings/sparse", warm=_warm)
