"""Sparse (SPLADE) embeddings: ``/v1/embeddings/sparse`` (``routes.py``) and TEI's ``/embed_sparse``
(``tei.py``), their schemas and answers. The work itself: ``core.serving.embeddings.embed_sparse``."""

from fastapi import APIRouter

from core.api.sparse import routes, tei

router = APIRouter()
for _module in (routes, tei):
    router.include_router(_module.router)
