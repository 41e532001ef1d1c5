"""Wire schemas of tokenizing: ``/v1/tokenize``, TEI's ``/tokenize`` and ``/decode``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from core.api.common import StrictRequest, Usage


class TokenizeRequest(StrictRequest):
    input: str | list[str]
    model: str | None = None
    add_special_tokens: bool = True


class Tokens(BaseModel):
    object: Literal["tokens"] = "tokens"
    index: int
    ids: list[int]
    tokens: list[str]
    count: int


class TokenizeResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Tokens]
    model: str
    max_length: int
    usage: Usage


class TeiTokenizeRequest(StrictRequest):
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class TeiDecodeRequest(StrictRequest):
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True
