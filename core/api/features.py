"""The HTTP API's features, one package each (as vLLM's ``entrypoints/pooling/<feature>/``): a feature's
routes, wire schemas and answer encoders live together, with its peers' shapes of the same work beside its
own (``tei.py``, ``cohere.py``). Add a package here to add its routes to every surface."""

from fastapi import APIRouter

from core.api import classify, embeddings, rerank, score, sparse, system, tokenize

router = APIRouter()
for feature in (embeddings, system, sparse, rerank, classify, score, tokenize):
    router.include_router(feature.router)
