"""Embeddings: OpenAI's ``/v1/embeddings`` with Infinity's media routes (``routes.py``), TEI's ``/embed``,
``/embed_all`` and ``/similarity`` (``tei.py``), Cohere's ``/v1/embed`` and ``/v2/embed`` (``cohere.py``); their
wire schemas (``schemas.py``) and answers (``encode.py``). The work itself: ``core.serving.embeddings``."""

from fastapi import APIRouter

from core.api.common import Feature
from core.api.embeddings import cohere, routes, tei
from core.api.embeddings.warm import warm_bodies
from core.capabilities import Capability

router = APIRouter()
for _module in (routes, cohere, tei):
    router.include_router(_module.router)

FEATURE = Feature(router, capability=Capability.EMBEDDINGS, route="/v1/embeddings", warm=warm_bodies)
