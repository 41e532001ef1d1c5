"""Sparse lexical embeddings (SPLADE, ``*ForMaskedLM``): max over tokens of log1p(relu(logits)), padding
masked, kept as (indices, values) of the non-zero vocabulary entries.

The pooling runs in the ``splade`` head (see ``core/backends/heads.py``) so a batch's (batch, seq, vocab)
logits never leave the backend; a backend that only has raw ``logits`` is pooled here instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import InvalidInput
from core.loading import ModelInfo
from core.tasks.base import TextTask
from core.tasks.embed import EmbedRequest
from core.tasks.prompts import resolve_prompt
from core.tokenization import Encoded
from core.tasks.chunking import refuse_long_input_options


@dataclass(slots=True)
class SparseVector:
    indices: np.ndarray  # int64 (k,), ascending vocabulary ids
    values: np.ndarray  # float32 (k,)


@dataclass(slots=True)
class SparseResult:
    vectors: list[SparseVector]
    prompt_tokens: int


def splade_pool(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(batch, seq, vocab) logits, (batch, seq) mask → (batch, vocab)."""
    act = np.log1p(np.maximum(logits, 0.0)) * mask[:, :, None].astype(logits.dtype)
    return act.max(axis=1)


def to_sparse(weights: np.ndarray) -> SparseVector:
    """One vocabulary-wide row of weights → its non-zero entries."""
    idx = np.flatnonzero(weights > 0)
    return SparseVector(idx.astype(np.int64), weights[idx].astype(np.float32))


class SparseTask(TextTask):
    name: ClassVar[str] = "sparse"
    head: ClassVar[str] = "splade"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.EMBEDDINGS_SPARSE, Capability.TOKENIZE})
    truncates_left: ClassVar[bool] = True

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        super().__init__(info, spec)

    def prepare(self, request: EmbedRequest) -> list[Encoded]:
        refuse_long_input_options(request, self.name)
        prompt = resolve_prompt(self.info, self.spec, request.prompt, request.prompt_name)
        if request.token_ids is not None:
            if prompt is not None and (request.prompt or request.prompt_name):
                raise InvalidInput("prompts apply to text input, not to token ids", param="prompt_name")
            return self.tokenizer.from_ids(request.token_ids, truncate=request.truncate)
        texts = request.texts or []
        if prompt is not None:  # prepended; SPLADE's max pooling takes every token, the prompt's too
            if request.truncation_direction == "left":
                raise InvalidInput("truncation_direction 'left' would cut the prompt off the start of the text",
                                   param="truncation_direction")
            texts = [prompt + t for t in texts]
        return self.tokenizer.encode(texts, truncate=request.truncate, direction=request.truncation_direction)

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[Encoded]) -> list[SparseVector]:
        if "sparse_embedding" in outputs:
            weights = outputs["sparse_embedding"]
        else:
            logits = outputs["logits"]
            lengths = np.fromiter((it.cost for it in items), dtype=np.int64, count=len(items))
            mask = np.arange(logits.shape[1])[None, :] < lengths[:, None]
            weights = splade_pool(logits, mask)
        return [to_sparse(row) for row in weights]

    def finish(self, request: EmbedRequest, items: Sequence[Encoded], results: list[SparseVector]) -> SparseResult:
        return SparseResult(results, sum(it.cost for it in items))

    def token_strings(self, indices: np.ndarray) -> list[str]:
        return [self.tokenizer.id_to_token(int(i)) or "" for i in indices]

    def describe(self) -> dict:
        return {
            "task": self.name,
            "capabilities": sorted(self.capabilities),
            "max_length": self.info.max_length,
            "vocab_size": self.tokenizer.vocab_size,
        }
