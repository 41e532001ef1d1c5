"""Wire schemas of sparse (SPLADE) embeddings: ``/v1/embeddings/sparse`` and TEI's ``/embed_sparse``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from core.api.common import EmbeddingInput, StrictRequest, TruncationDirection, Usage


class SparseEmbeddingRequest(StrictRequest):
    """``/v1/embeddings/sparse``: the OpenAI embeddings request, answered with sparse vectors."""

    input: EmbeddingInput
    model: str | None = None
    truncate: bool = True
    return_tokens: bool = Field(default=False, description="also return the vocabulary token of each index")
    user: str | None = None


class SparseVector(BaseModel):
    indices: list[int]
    values: list[float]
    tokens: list[str] | None = None


class SparseEmbedding(BaseModel):
    object: Literal["sparse_embedding"] = "sparse_embedding"
    index: int
    embedding: SparseVector


class SparseEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[SparseEmbedding]
    model: str
    usage: Usage


class TeiSparseRequest(StrictRequest):
    inputs: EmbeddingInput
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None
