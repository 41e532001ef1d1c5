"""Tokenizing: ``/v1/tokenize`` (``routes.py``), TEI's ``/tokenize`` and ``/decode`` (``tei.py``), their
schemas and answers. The work itself: ``core.serving.models.tokenize`` and ``decode``."""

from fastapi import APIRouter

from core.api.common import Feature
from core.api.tokenize import routes, tei
from core.capabilities import Capability

router = APIRouter()
for _module in (routes, tei):
    router.include_router(_module.router)

FEATURE = Feature(router, capability=Capability.TOKENIZE, route="/v1/tokenize")
