"""Reranking with a cross-encoder (``*ForSequenceClassification`` with one label): (query, document) pairs →
one logit each → sigmoid (sentence-transformers' CrossEncoder default) unless raw scores are asked for."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import InvalidInput
from core.loading import ModelInfo, labels_of, num_labels
from core.tasks.activations import cross_encoder_activation, sigmoid
from core.tasks.base import ScoreResult
from core.tasks.base import TextTask
from core.tokenization import Encoded


@dataclass(slots=True)
class RerankRequest:
    query: str
    documents: list[str]
    raw_scores: bool = False
    truncate: bool = True
    max_tokens_per_doc: int | None = None
    #: LLM rerankers: the task instruction written into the prompt (None: the model's default)
    instruction: str | None = None


class RerankTask(TextTask):
    name: ClassVar[str] = "rerank"
    head: ClassVar[str] = "sequence-classification"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.RERANK, Capability.TOKENIZE})

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        if num_labels(info.config) != 1:
            raise InvalidInput(
                f"{info.folder}: a reranker needs a sequence-classification model with one label "
                f"(this one has {num_labels(info.config)}); serve it with task 'classify'"
            )
        super().__init__(info, spec)
        st_config_path = info.folder / "config_sentence_transformers.json"
        st_config = json.loads(st_config_path.read_text()) if st_config_path.exists() else {}
        self.activation = cross_encoder_activation(info.config, st_config)

    def prepare(self, request: RerankRequest) -> list[Encoded]:
        if not request.documents:
            raise InvalidInput("'documents' must not be empty", param="documents")
        if request.instruction is not None:
            raise InvalidInput("'instruction' applies to LLM rerankers (a causal LM prompted with it); this "
                               "model is a cross-encoder", param="instruction")
        return self.tokenizer.encode_pairs(
            [(request.query, d) for d in request.documents], truncate=request.truncate,
            max_second=request.max_tokens_per_doc,
        )

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[Encoded]) -> list[float]:
        return [float(x) for x in outputs["logits"][:, 0]]

    def finish(self, request: RerankRequest, items: Sequence[Encoded], results: list[float]) -> ScoreResult:
        logits = np.asarray(results, dtype=np.float32)
        scores = logits if request.raw_scores or self.activation == "identity" else sigmoid(logits)
        return ScoreResult(scores, sum(it.cost for it in items))

    def score_labels(self) -> list[str]:
        return labels_of(self.info.config)  # the one label of the cross-encoder's head

    def describe(self) -> dict:
        return {
            "task": self.name,
            "capabilities": sorted(self.capabilities),
            "max_length": self.info.max_length,
            "activation": self.activation,
        }
