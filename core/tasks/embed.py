"""Text embeddings: tokenize → encoder → pool (sentence-transformers semantics) → normalize/Matryoshka."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import InvalidInput, TooLarge, Unsupported
from core.loading import ModelInfo, read_embed_pipeline, task_adapters
from core.tasks import chunking
from core.tasks.base import INLINE_PREPARE_CHARS, TextTask

#: a late-chunking request with more spans than this is prepared on a worker thread, whatever its length
INLINE_PREPARE_SPANS = 32
from core.tasks.dense import DenseLayer
from core.tasks.prompts import resolve_prompt
from core.tasks.vectors import l2_normalize, pool, shape_vectors
from core.tokenization import MAX_TOKENS_PER_CHAR, Encoded, unencodable


@dataclass(slots=True)
class EmbedRequest:
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    truncate: bool = True
    normalize: bool | None = None  # None: the model's own default
    dimensions: int | None = None
    modality: str = "text"  # text | image | audio
    inputs: list[str] | None = None  # media references (data: URIs, http(s) URLs) for image/audio
    media: Any = None  # core.media.MediaFetcher built from the settings at the edge (None: safe defaults)
    prompt: str | None = None  # literal prompt text, prepended to each text
    prompt_name: str | None = None  # a named prompt of the model (config_sentence_transformers.json / spec)
    input_type: str | None = None  # "query" | "document" (late interaction encodes them differently)
    #: what the request asks for: "pooled", one vector per text (/v1/embeddings); "sparse" (a multi-output
    #: model on the sparse routes); "tokens", every token's vector, unpooled (TEI's /embed_all)
    output: str = "pooled"
    #: which end an over-long text loses: "right" (keep the start) or "left" (keep the end)
    truncation_direction: str = "right"
    #: long inputs (core/tasks/chunking.py): windows pooled into one vector per text, or one vector per chunk
    chunking: Any = None  # ChunkOptions; None: the model's default; True/False: default windows on/off
    late_chunking: Any = None  # LateChunkOptions
    #: a task adapter of the model, by name (jina-embeddings-v3: retrieval.query, retrieval.passage, …)
    task: str | None = None
    #: vision–language embedders: chat conversations, one vector each (core/tasks/vlm_embed.py ``Conversation``);
    #: their images are ``inputs`` by index
    conversations: list[Any] | None = None

    def media_fetcher(self) -> Any:
        """The request's ``core.media.MediaFetcher``: the one set at the edge, else one with the safe defaults."""
        if self.media is None:
            from core.media import MediaFetcher

            self.media = MediaFetcher()
        return self.media


@dataclass(slots=True)
class AdapterEncoded(Encoded):
    """A tokenized input of a model with task adapters: the index of the adapter it runs through."""

    adapter: int = 0


@dataclass(slots=True)
class EmbedResult:
    #: float32 (n, d); multi-vector models (late interaction, ColPali): a list of n arrays (tokens_i, d)
    vectors: np.ndarray | list[np.ndarray]
    prompt_tokens: int
    #: tokens per input (chunked: its windows' together), where each input has one vector of its own
    #: (the embedding cache stores them with the vectors); None where inputs share items (late chunking)
    input_tokens: list[int] | None = None


#: vision–language model types the embed task refuses (never run as text): the Qwen2-VL layouts are served by the
#: vlm_embed task; Qwen3-VL's mixture of experts is not implemented
VISION_LANGUAGE_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})


class EmbedTask(TextTask):
    name: ClassVar[str] = "embed"
    head: ClassVar[str] = "encoder"
    #: embed_all: every token's vector (TEI's /embed_all)
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.EMBEDDINGS, Capability.TOKENIZE,
                                                               Capability.EMBED_ALL})
    modalities: ClassVar[tuple[str, ...]] = ("text",)
    truncates_left: ClassVar[bool] = True
    chunks: ClassVar[bool] = True

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        if info.model_type in VISION_LANGUAGE_TYPES:
            from core.loading import VLM_EMBED_TYPES

            served = info.model_type in VLM_EMBED_TYPES
            raise Unsupported(
                f"{info.folder}: model_type {info.model_type!r} is a vision–language model; its embedders format text "
                "and images through the chat template and pool the last token, so served as a text encoder it would "
                "give different vectors. " + ("Serve it with task 'vlm_embed' (what task 'auto' picks)" if served else
                f"Its layout is not implemented (the vlm_embed task serves {sorted(VLM_EMBED_TYPES)}); serve it with "
                "its "
                "model card's code"), code="unsupported_architecture")
        super().__init__(info, spec)
        self.spec = spec
        #: Pooling mode, prompt handling, the Dense/Normalize steps after pooling, trailing Normalize
        self.pipeline = read_embed_pipeline(info.folder, pooling=spec.pooling, dense_path=spec.dense_path)
        self.steps = [step if step == "normalize" else DenseLayer.load(step) for step in self.pipeline.steps]
        width = (info.dimension or 0) * len(self.pipeline.pooling.split("+"))
        for step in self.steps:
            if isinstance(step, DenseLayer):
                if width and step.in_features != width:
                    raise InvalidInput(f"{info.folder}: a Dense module takes {step.in_features} features but "
                                       f"receives {width} (pooling {self.pipeline.pooling!r})")
                width = step.out_features
        self.dimension = width or info.dimension
        #: task adapters chosen per request (``task``); ``task_required``: the backend has no default without one
        self.adapters = task_adapters(info.config)
        self.task_required = False

    def check_backend(self, backend) -> None:
        """A model with task adapters served by a backend without a default adapter (an ONNX graph takes a task
        id, as jina-embeddings-v3's published graph and our exporter's do, and holds no path without one:
        ``default_adapter`` off), so every request names its task."""
        self.task_required = bool(self.adapters) and not backend.default_adapter

    def batch_group(self, request: EmbedRequest) -> str | None:
        """A batch runs one task adapter (an ONNX graph takes one task id per call)."""
        return request.task if self.adapters else None

    def _adapter(self, request: EmbedRequest) -> int | None:
        """The index of the request's task adapter, or None (the model's own default, on torch)."""
        if request.task is None:
            if self.task_required:
                raise InvalidInput(f"this model runs a task adapter per request, and its ONNX graph has no default "
                                   f"without one: set 'task' to one of {list(self.adapters)}", param="task")
            return None
        if not self.adapters:
            raise InvalidInput("'task' selects a task adapter (jina-embeddings-v3's LoRA tasks); this model has none",
                               param="task")
        if request.task not in self.adapters:
            raise InvalidInput(f"unknown task {request.task!r}; this model's tasks: {list(self.adapters)}",
                               param="task")
        if request.chunking is not None or request.late_chunking is not None or request.token_ids is not None:
            raise InvalidInput("'task' applies to text input without chunking", param="task")
        return self.adapters.index(request.task)

    def collate(self, items: Sequence[Encoded]) -> Mapping[str, np.ndarray]:
        batch = super().collate(items)
        if not self.adapters or not isinstance(items[0], AdapterEncoded):
            return batch
        adapter = items[0].adapter
        if any(getattr(it, "adapter", None) != adapter for it in items):  # batch_group keeps tasks apart
            from core.errors import BackendFailure

            raise BackendFailure("internal: a batch of embed mixed task adapters")
        # torch: the model's own code takes adapter_mask (one task index per row); ONNX: the graph's task_id
        return {**batch, "adapter_mask": np.full(len(items), adapter, dtype=np.int64),
                "task_id": np.asarray(adapter, dtype=np.int64)}

    def warmup_batches(self, batch_tokens: int, max_batch_size: int) -> list[Mapping[str, np.ndarray]]:
        batches = super().warmup_batches(batch_tokens, max_batch_size)
        if not self.task_required:
            return batches
        return [{**b, "adapter_mask": np.zeros(len(b["input_ids"]), np.int64), "task_id": np.asarray(0, np.int64)}
                for b in batches]

    # worker thread
    def prepare_inline(self, request: EmbedRequest) -> bool:
        texts = request.texts
        if texts is None or request.modality != "text":
            return False
        prompt_chars = len(request.prompt or "") * len(texts)  # the prompt is tokenized with every text
        late = request.late_chunking
        if late is not None:  # one context: the chunks and the separators between them; each span is pooled
            if late.spans is not None and len(late.spans) > INLINE_PREPARE_SPANS:
                return False
            prompt_chars += len(late.separator) * max(0, len(texts) - 1) if late.spans is None else 0
        return sum(map(len, texts)) + prompt_chars <= INLINE_PREPARE_CHARS

    def answer_values(self, request: EmbedRequest, items: Sequence[Encoded]) -> int | None:
        """TEI's /embed_all answers the encoder's vector of every token."""
        if request.output != "tokens":
            return None
        return sum(it.cost - it.pool_from for it in items) * (self.info.dimension or 0)

    def prepare(self, request: EmbedRequest) -> list[Encoded]:
        adapter = self._adapter(request) if self.adapters or request.task is not None else None
        items = self._prepare(request)
        if adapter is not None:
            items = [AdapterEncoded(it.ids, it.type_ids, it.pool_from, adapter=adapter) for it in items]
        if request.output == "tokens":
            for item in items:
                item.all_tokens = True
        return items

    def _prepare(self, request: EmbedRequest) -> list[Encoded]:
        if request.modality not in self.modalities:
            raise InvalidInput(
                f"modality {request.modality!r} is not served by this model; its modalities: {list(self.modalities)}",
                param="modality",
            )
        if request.dimensions is not None and self.dimension and request.dimensions > self.dimension:
            raise InvalidInput(
                f"dimensions={request.dimensions} exceeds the model's dimension {self.dimension}",
                param="dimensions",
            )
        request.chunking = chunking.in_force(self, request)  # the request's windows, or the model's default
        if request.chunking is not None or request.late_chunking is not None:
            if request.late_chunking is not None:
                return chunking.prepare_late(self, request)
            return chunking.prepare_chunked(self, request)
        prompt = resolve_prompt(self.info, self.spec, request.prompt, request.prompt_name)
        if request.token_ids is not None:
            if request.prompt is not None or request.prompt_name is not None:
                raise InvalidInput("prompts apply to text input, not to token ids", param="prompt")
            return self.tokenizer.from_ids(request.token_ids, truncate=request.truncate)
        if prompt is None:
            return self.tokenizer.encode(request.texts or [], truncate=request.truncate,
                                         direction=request.truncation_direction)
        if request.truncation_direction == "left":
            raise InvalidInput("truncation_direction 'left' would cut the prompt off the start of the text; "
                               "send no prompt, or truncate from the right", param="truncation_direction")
        filled = self._prompt_fills_the_window(prompt, request)
        if filled is not None:
            return filled
        items = self.tokenizer.encode([prompt + t for t in request.texts or []], truncate=request.truncate)
        if not self.pipeline.include_prompt:
            skip = self.tokenizer.prompt_length(prompt)
            for item in items:
                item.pool_from = min(skip, item.cost)
        return items

    #: tokens past the model's length beyond which a prompt's tail cannot reach the truncated window
    PROMPT_MARGIN = 16

    def _prompt_fills_the_window(self, prompt: str, request: EmbedRequest) -> list[Encoded] | None:
        """A prompt longer than the model's window is tokenized once, not once per text: truncated,
        ``prompt + text`` is the prompt's own first tokens for every text (the texts never reach the
        window), and untruncated it is refused once. None: the prompt leaves room for the texts."""
        error = unencodable([prompt], "prompt")
        if error is not None:
            raise error
        if MAX_TOKENS_PER_CHAR * len(prompt) + 2 <= self.tokenizer.max_length + self.PROMPT_MARGIN:
            return None  # too short to fill the window: not tokenized an extra time
        (alone,) = self.tokenizer.encode([prompt], truncate=False, check_length=False, param="prompt")
        if alone.cost <= self.tokenizer.max_length + self.PROMPT_MARGIN:
            return None
        if not request.truncate:
            raise TooLarge(f"the prompt alone has {alone.cost} tokens, more than the model's maximum of "
                           f"{self.tokenizer.max_length}; send a shorter prompt or set truncate=true",
                           param="prompt", code="input_too_long")
        (window,) = self.tokenizer.encode([prompt], truncate=True, param="prompt")
        pool_from = min(self.tokenizer.prompt_length(prompt), window.cost) if not self.pipeline.include_prompt else 0
        return [Encoded(window.ids, window.type_ids, pool_from) for _ in request.texts or []]

    # inference thread
    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[Encoded]) -> list[np.ndarray]:
        hidden = outputs["last_hidden_state"]
        lengths = np.fromiter((it.cost for it in items), dtype=np.int64, count=len(items))
        mask = np.arange(hidden.shape[1])[None, :] < lengths[:, None]
        if any(it.pool_from for it in items):  # prompt tokens left out of pooling (include_prompt: false)
            starts = np.fromiter((it.pool_from for it in items), dtype=np.int64, count=len(items))
            mask &= np.arange(hidden.shape[1])[None, :] >= starts[:, None]
        pooled = pool(hidden, mask, self.pipeline.pooling).astype(np.float32, copy=False)
        for step in self.steps:  # Dense modules (and a Normalize between them), in module order
            pooled = l2_normalize(pooled) if step == "normalize" else step(pooled)
        results = list(pooled)
        for i, item in enumerate(items):
            if getattr(item, "all_tokens", False):  # the encoder's token vectors, as TEI's /embed_all returns them
                results[i] = np.ascontiguousarray(hidden[i, item.pool_from:item.cost], dtype=np.float32)
            keep = getattr(item, "keep", None)  # a late-chunking window: its token vectors, pooled per chunk later
            if keep is not None:
                results[i] = hidden[i, keep].astype(np.float32)
        return results

    def finish(self, request: EmbedRequest, items: Sequence[Encoded], results: list[np.ndarray]) -> EmbedResult:
        if request.output == "tokens":
            return EmbedResult(list(results), sum(it.cost for it in items))
        if request.late_chunking is not None:
            results = list(chunking.finish_late(self, items, results))
        # np.array stacks rows of one length as np.stack does, at a third of its cost per request
        vectors = np.array(results) if results else np.zeros((0, self.dimension or 0), np.float32)
        vectors = self.shape(vectors, request)
        costs = [it.cost for it in items]
        if request.chunking is not None:  # windows → one vector per text
            normalize = self.pipeline.normalize if request.normalize is None else request.normalize
            vectors = chunking.finish_chunked(request, items, vectors, normalize)
            per_input = np.bincount([it.text for it in items], weights=costs, minlength=len(vectors))
            return EmbedResult(vectors, sum(costs), [int(n) for n in per_input])
        return EmbedResult(vectors, sum(costs), None if request.late_chunking is not None else costs)

    def shape(self, vectors: np.ndarray, request: EmbedRequest) -> np.ndarray:
        normalize = self.pipeline.normalize if request.normalize is None else request.normalize
        return shape_vectors(vectors, request.dimensions, normalize)

    def describe(self) -> dict:
        return {
            "task": self.name,
            "capabilities": sorted(self.capabilities),
            "dimension": self.dimension,
            "max_length": self.info.max_length,
            "pooling": self.pipeline.pooling,
            "dense": [[s.in_features, s.out_features] for s in self.steps if isinstance(s, DenseLayer)],
            "normalize": self.pipeline.normalize,
            "prompts": sorted({**self.info.prompts, **self.spec.prompts}),
            **({"tasks": list(self.adapters)} if self.adapters else {}),
        }
