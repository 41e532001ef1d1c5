"""Wire schemas, in one place (as vLLM's ``protocol``): OpenAI-shaped requests and responses.

Unknown request fields are ignored (peers' clients send extras); known fields are validated strictly:
no coercion (``"32"`` is not 32, ``true`` is not 1, ``"yes"`` is not a boolean), since a coerced value
would silently change the answer.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), strict=True)


EmbeddingInput = Union[str, list[str], list[int], list[list[int]]]


class Chunking(_Request):
    """Long texts: windows of ``size`` tokens overlapping by ``overlap``, one vector per text (their
    token-weighted mean)."""

    size: int | None = Field(default=None, gt=0, description="tokens per window; default: the model's max length")
    overlap: int = Field(default=0, ge=0, description="tokens shared by consecutive windows")


class LateChunking(_Request):
    """Late chunking: one pass over the whole context, one vector per chunk (the mean of its token vectors)."""

    spans: list[list[int]] | None = Field(
        default=None, description="character spans [start, end) of the chunks in the one input text; "
        "default: the inputs are the chunks, joined by 'separator'")
    separator: str = Field(default=" ", description="what joins the input chunks into one context")
    overlap: int = Field(default=0, ge=0, description="tokens shared by the windows of a context longer "
                         "than the model's max length")


class EmbeddingRequest(_Request):
    input: EmbeddingInput | None = Field(
        default=None, description="a string, a list of strings, or token-id arrays (exactly one of input and messages)")
    messages: list[Any] | None = Field(
        default=None, description="vision–language embedders: one chat conversation (vLLM's chat embeddings), "
        "[{role, content}] with content a string or a list of parts {type: text, text} / {type: image_url, "
        "image_url: {url}}; one vector for the whole conversation")
    add_generation_prompt: bool = Field(
        default=False, description="messages: end with the chat template's generation prompt (assistant turn)")
    continue_final_message: bool = Field(
        default=False, description="messages: leave the final message open (no end-of-turn), e.g. an assistant "
        "message holding a model's pooling token")
    model: str | None = Field(default=None, description="served model name; optional with one model")
    encoding_format: Literal["float", "base64", "base64_packed"] = Field(
        default="float", description="float: JSON numbers; base64: little-endian float32 (quantized types too: "
        "their integer values as float32, which is what the OpenAI SDK decodes); base64_packed: quantized "
        "types as their raw int8/uint8 bytes")
    dimensions: int | None = Field(
        default=None, ge=0, description="Matryoshka: keep the first N, re-normalize; 0 (what Infinity's client "
        "sends by default): the full vector")
    user: str | None = None
    # extensions
    normalize: bool | None = Field(default=None, description="L2-normalize; default: the model's own setting")
    truncate: bool = Field(default=True, description="truncate to the model's max length; false: 413 when longer")
    modality: Literal["text", "image", "audio"] = Field(
        default="text",
        description="what 'input' holds: text, or image/audio references (data: URIs or http(s) URLs)",
    )
    prompt: str | None = Field(default=None, description="literal prompt prepended to each input (wins over prompt_name)")
    prompt_name: str | None = Field(default=None, description="a named prompt of the model (see /v1/models 'prompts')")
    embedding_type: Literal["float", "int8", "uint8", "binary", "ubinary"] | None = Field(
        default=None,
        description="quantized output (sentence-transformers' quantize_embeddings); default: the model's "
        "embedding_dtype setting (float). int8/uint8 are calibrated once per model on fixed texts",
    )
    input_type: str | None = Field(
        default=None, description="multi-vector models: 'query' or 'document' (default); Cohere's search_query/search_document too"
    )
    chunking: Chunking | bool | None = Field(
        default=None, description="embed long texts in windows (docs/text-tasks.md); true: the model's default "
        "windows (or its max length), false: no chunking (a model's default turned off); default: the model's")
    late_chunking: bool | LateChunking | None = Field(
        default=None, description="one vector per chunk of one context (true: the inputs are the chunks)")
    task: str | None = Field(
        default=None, description="a task adapter of the model, e.g. jina-embeddings-v3's retrieval.query, "
        "retrieval.passage, separation, classification, text-matching (see /v1/models 'tasks')")


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
    model_sha: str | None = None  # the Hub commit served; null for a local folder


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


# --- text tasks: rerank, classify, sparse, score, tokenize ------------------------------------------------

Document = Union[str, dict[str, Any]]


class RerankRequest(_Request):
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


class CohereRerankRequest(_Request):
    """Cohere v2 ``/v2/rerank``."""

    model: str | None = None
    query: str
    documents: list[Document]
    top_n: int | None = None
    max_tokens_per_doc: int | None = None
    return_documents: bool = False
    instruction: str | None = Field(default=None, description="LLM rerankers: the task instruction of the prompt")


class ClassifyRequest(_Request):
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


class SparseEmbeddingRequest(_Request):
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


class ScoreRequest(_Request):
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


class TokenizeRequest(_Request):
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


# --- TEI native routes ------------------------------------------------------------------------------------

#: TEI's TruncationDirection (it writes "Left" / "Right"; lower case accepted too)
TruncationDirection = Literal["Left", "Right", "left", "right"]


class TeiEmbedRequest(_Request):
    inputs: EmbeddingInput  # texts, or token ids (a list, or a list of lists)
    normalize: bool = True
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None
    dimensions: int | None = Field(default=None, gt=0)


class TeiEmbedAllRequest(_Request):
    inputs: EmbeddingInput
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None


class TeiSparseRequest(_Request):
    inputs: EmbeddingInput
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None


class TeiSimilarityInputs(_Request):
    source_sentence: str
    sentences: list[str]


class TeiSimilarityRequest(_Request):
    inputs: TeiSimilarityInputs
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None


class TeiPredictRequest(_Request):
    inputs: str | list[str | list[str]]
    raw_scores: bool = False
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"


class TeiTokenizeRequest(_Request):
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class TeiDecodeRequest(_Request):
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class CohereEmbedRequest(_Request):
    """Cohere v2 ``/v2/embed`` (what ``cohere.ClientV2.embed`` sends)."""

    model: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None  # data: URIs
    input_type: str | None = None  # search_document | search_query | classification | clustering | image
    embedding_types: list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]] | None = None
    truncate: Literal["NONE", "START", "END"] | None = None
    output_dimension: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
