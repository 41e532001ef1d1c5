"""Tokenizing: ``/v1/tokenize`` (``routes.py``), TEI's ``/tokenize`` and ``/decode`` (``tei.py``), their
schemas and answers. The work itself: ``core.serving.models.tokenize`` and ``decode``."""

from fastapi import APIRouter

from core.api.tokenize import routes, tei

router = APIRouter()
for _module in (routes, tei):
    router.include_router(_module.router)
