"""Route modules, one per concern. Add a module here to add routes to every surface."""

from fastapi import APIRouter

from core.api.routes import embeddings, system
from core.api.routes import classify, cohere, rerank, score, sparse, tei, tokenize

router = APIRouter()
for module in (embeddings, system, sparse, rerank, cohere, classify, score, tokenize, tei):
    router.include_router(module.router)
