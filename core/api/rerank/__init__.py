"""Reranking: ``/v1/rerank`` and ``/rerank`` (Infinity, Cohere v1 and TEI's bodies: ``routes.py``) and
Cohere v2's ``/v2/rerank`` (``cohere.py``), their schemas and answers. The work itself:
``core.serving.ranking.rerank``."""

from fastapi import APIRouter

from core.api.rerank import cohere, routes

router = APIRouter()
for _module in (routes, cohere):
    router.include_router(_module.router)
