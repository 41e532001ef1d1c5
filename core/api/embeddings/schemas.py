"""Wire schemas of the embeddings feature: OpenAI's ``/v1/embeddings`` (and Infinity's media routes), TEI's
``/embed``, ``/embed_all`` and ``/similarity``, Cohere's ``/v1/embed`` and ``/v2/embed``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from core.api.common import EmbeddingInput, StrictRequest, TruncationDirection, Usage


class Chunking(StrictRequest):
    """Long texts: windows of ``size`` tokens overlapping by ``overlap``, one vector per text (their
    token-weighted mean)."""

    size: int | None = Field(default=None, gt=0, description="tokens per window; default: the model's max length")
    overlap: int = Field(default=0, ge=0, description="tokens shared by consecutive windows")


class LateChunking(StrictRequest):
    """Late chunking: one pass over the whole context, one vector per chunk (the mean of its token vectors)."""

    spans: list[list[int]] | None = Field(
        default=None, description="character spans [start, end) of the chunks in the one input text; "
        "default: the inputs are the chunks, joined by 'separator'")
    separator: str = Field(default=" ", description="what joins the input chunks into one context")
    overlap: int = Field(default=0, ge=0, description="tokens shared by the windows of a context longer "
                         "than the model's max length")


class EmbeddingRequest(StrictRequest):
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


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class TeiEmbedRequest(StrictRequest):
    inputs: EmbeddingInput  # texts, or token ids (a list, or a list of lists)
    normalize: bool = True
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None
    dimensions: int | None = Field(default=None, gt=0)


class TeiEmbedAllRequest(StrictRequest):
    inputs: EmbeddingInput
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None


class TeiSimilarityInputs(StrictRequest):
    source_sentence: str
    sentences: list[str]


class TeiSimilarityRequest(StrictRequest):
    inputs: TeiSimilarityInputs
    truncate: bool = True
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None


class CohereEmbedRequest(StrictRequest):
    """Cohere v2 ``/v2/embed`` (what ``cohere.ClientV2.embed`` sends)."""

    model: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None  # data: URIs
    input_type: str | None = None  # search_document | search_query | classification | clustering | image
    embedding_types: list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]] | None = None
    truncate: Literal["NONE", "START", "END"] | None = None
    output_dimension: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
