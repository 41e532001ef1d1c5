"""Wire schemas of ``/v1/score`` (late-interaction MaxSim of documents against a query)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from core.api.common import Document, StrictRequest, Usage


class ScoreRequest(StrictRequest):
    """``/v1/score``: late-interaction (MaxSim) scores of documents against a query, in input order."""

    query: str
    documents: list[Document]
    model: str | None = None
    truncate: bool = True


class Score(BaseModel):
    object: Literal["score"] = "score"
    index: int
    score: float


class ScoreResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Score]
    model: str
    usage: Usage
