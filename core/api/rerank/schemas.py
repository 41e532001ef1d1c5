"""Wire schemas of reranking: ``/v1/rerank`` and ``/rerank`` (Infinity, Cohere v1, and TEI's body with
``texts``), Cohere v2's ``/v2/rerank``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from core.api.common import Document, StrictRequest, Usage


class RerankRequest(StrictRequest):
    """``/v1/rerank`` and ``/rerank`` (Infinity / Cohere v1 shape). ``/rerank`` with ``texts`` instead of
    ``documents`` is TEI's shape (``query``, ``texts``, ``raw_scores``, ``return_text``, ``truncate``)."""

    query: str
    documents: list[Document] | None = Field(default=None, description="strings, or objects with a 'text' field")
    texts: list[str] | None = Field(default=None, description="TEI's name for the documents (on /rerank)")
    model: str | None = None
    top_n: int | None = Field(default=None, description="return the best N (default: all)")
    return_documents: bool = False
    raw_scores: bool = Field(default=False, description="logits instead of the model's activation (sigmoid)")
    truncate: bool = Field(default=True, description="truncate each pair (document side first); false: 413")
    # TEI fields, used when 'texts' is sent
    return_text: bool = False
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"
    max_tokens_per_doc: int | None = Field(default=None, description="Cohere: clip each document to N tokens")
    instruction: str | None = Field(default=None, description="LLM rerankers: the task instruction of the prompt "
                                    "(default: the model's)")


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: Document | None = None


class RerankResponse(BaseModel):
    object: Literal["rerank"] = "rerank"
    id: str
    created: int
    results: list[RerankResult]
    model: str
    usage: Usage


class CohereRerankRequest(StrictRequest):
    """Cohere v2 ``/v2/rerank``."""

    model: str | None = None
    query: str
    documents: list[Document]
    top_n: int | None = None
    max_tokens_per_doc: int | None = None
    return_documents: bool = False
    instruction: str | None = Field(default=None, description="LLM rerankers: the task instruction of the prompt")
