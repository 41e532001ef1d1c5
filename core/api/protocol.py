"""Wire schemas, in one place (as vLLM's ``protocol``): OpenAI-shaped requests and responses.

Unknown request fields are ignored (peers' clients send extras); known fields are validated strictly.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


EmbeddingInput = Union[str, list[str], list[int], list[list[int]]]


class EmbeddingRequest(_Request):
    input: EmbeddingInput = Field(description="a string, a list of strings, or token-id arrays")
    model: str | None = Field(default=None, description="served model name; optional with one model")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, gt=0, description="Matryoshka: keep the first N, re-normalize")
    user: str | None = None
    # extensions
    normalize: bool | None = Field(default=None, description="L2-normalize; default: the model's own setting")
    truncate: bool = Field(default=True, description="truncate to the model's max length; false: 413 when longer")
    modality: Literal["text", "image", "audio"] = Field(
        default="text",
        description="what 'input' holds: text, or image/audio references (data: URIs or http(s) URLs)",
    )


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str | list[list[float]] | list[str]  # multi-vector models: one vector per token


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "tessera"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


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
