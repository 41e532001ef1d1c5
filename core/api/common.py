"""What every feature shares: how it declares itself (:class:`Feature`), the strict request base, the input
unions, usage, the error shape, and the JSON encoding of answers (orjson straight from numpy).

Unknown request fields are ignored (peers' clients send extras); known fields are validated strictly:
no coercion (``"32"`` is not 32, ``true`` is not 1, ``"yes"`` is not a boolean), since a coerced value
would silently change the answer.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union

import numpy as np
import orjson
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from core.capabilities import Capability

#: a model's name and input modalities → its warm requests to a feature's route, as (label, JSON body)
WarmBodies = Callable[[str, tuple[str, ...]], list[tuple[str, dict[str, Any]]]]
#: the text of every warm request
WARM_TEXT = "warm-up"


@dataclass(frozen=True)
class Feature:
    """One feature of the HTTP API, as ``core/api/features.py`` lists it: its routes and, for the features a
    task's capability names, that capability, the feature's main route (what SageMaker's ``route=`` names,
    less ``/v1/``) and the requests the app's warm pass sends to it (none: its first request pays the first
    pass, as the auxiliary routes do)."""

    router: APIRouter
    capability: Capability | None = None
    route: str | None = None
    warm: WarmBodies | None = None


class StrictRequest(BaseModel):
    """The base of every request schema."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=(), strict=True)


EmbeddingInput = Union[str, list[str], list[int], list[list[int]]]
Document = Union[str, dict[str, Any]]
#: TEI's TruncationDirection (it writes "Left" / "Right"; lower case accepted too)
TruncationDirection = Literal["Left", "Right", "left", "right"]


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_RESPONSES = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in {
        400: "bad input",
        401: "missing or wrong API key",
        404: "unknown model",
        413: "request too large",
        422: "request does not match the schema",
        429: "overloaded (see Retry-After)",
        503: "not ready",
        504: "deadline passed",
    }.items()
}


_OPTS = orjson.OPT_SERIALIZE_NUMPY


def dumps(obj) -> bytes:
    return orjson.dumps(obj, option=_OPTS)


def usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def response_id(kind: str) -> tuple[str, int]:
    return f"{kind}-{uuid.uuid4().hex}", int(time.time())


def ranked(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """Indices by descending score (ties keep input order), cut to ``top_n``."""
    order = np.argsort(-scores, kind="stable").tolist()
    return order[:top_n] if top_n is not None else order
