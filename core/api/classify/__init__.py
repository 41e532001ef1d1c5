"""Classification: ``/v1/classify`` (Infinity's shape: ``routes.py``) and TEI's ``/predict`` (``tei.py``), their
schemas and answers. The work itself: ``core.serving.ranking.classify`` and ``predict``."""

from fastapi import APIRouter

from core.api.classify import routes, tei

router = APIRouter()
for _module in (routes, tei):
    router.include_router(_module.router)
