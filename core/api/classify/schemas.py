"""Wire schemas of classification: ``/v1/classify`` (Infinity's shape) and TEI's ``/predict``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from core.api.common import StrictRequest, TruncationDirection, Usage


class ClassifyRequest(StrictRequest):
    """``/v1/classify`` (Infinity shape, plus ``top_k`` and ``labels``)."""

    input: str | list[str]
    model: str | None = None
    raw_scores: bool = Field(default=False, description="logits instead of softmax/sigmoid")
    top_k: int | None = Field(default=None, description="keep the N best labels per input (default: all)")
    labels: list[str] | None = Field(default=None, description="report only these labels (must be the model's)")
    truncate: bool = True


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    object: Literal["classify"] = "classify"
    id: str
    created: int
    data: list[list[LabelScore]]
    model: str
    usage: Usage


class TeiPredictRequest(StrictRequest):
    inputs: str | list[str | list[str]]
    raw_scores: bool = False
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
