"""Sequence classification: texts (or text pairs) → logits → softmax, or sigmoid for multi-label configs
(``problem_type: multi_label_classification``), as transformers' text-classification pipeline does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import InvalidInput
from core.loading import ModelInfo, labels_of
from core.tasks.activations import sigmoid, softmax
from core.tasks.base import TextTask
from core.tokenization import Encoded


@dataclass(slots=True)
class ClassifyRequest:
    texts: list[str] | None = None
    pairs: list[tuple[str, str]] | None = None
    raw_scores: bool = False
    truncate: bool = True
    truncation_direction: str = "right"  # "left": keep the end of an over-long text (single texts)


@dataclass(slots=True)
class ClassifyResult:
    scores: np.ndarray  # float32 (n, num_labels), columns in label order
    labels: list[str]
    prompt_tokens: int


class ClassifyTask(TextTask):
    name: ClassVar[str] = "classify"
    head: ClassVar[str] = "sequence-classification"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.CLASSIFY, Capability.TOKENIZE})
    truncates_left: ClassVar[bool] = True

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        super().__init__(info, spec)
        self.labels = labels_of(info.config)
        self.multi_label = info.config.get("problem_type") == "multi_label_classification" or len(self.labels) == 1

    def prepare(self, request: ClassifyRequest) -> list[Encoded]:
        if request.pairs is not None:
            if request.truncation_direction == "left":
                raise InvalidInput("truncation_direction 'left' applies to single texts, not to pairs",
                                   param="truncation_direction")
            return self.tokenizer.encode_pairs(request.pairs, truncate=request.truncate)
        if not request.texts:
            raise InvalidInput("'input' must not be empty", param="input")
        return self.tokenizer.encode(request.texts, truncate=request.truncate, direction=request.truncation_direction)

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[Encoded]) -> list[np.ndarray]:
        return list(outputs["logits"].astype(np.float32, copy=False))

    def finish(self, request: ClassifyRequest, items: Sequence[Encoded], results: list[np.ndarray]) -> ClassifyResult:
        logits = np.stack(results) if results else np.zeros((0, len(self.labels)), np.float32)
        if request.raw_scores:
            scores = logits
        elif self.multi_label:
            scores = sigmoid(logits)
        else:
            scores = softmax(logits)
        return ClassifyResult(scores, self.labels, sum(it.cost for it in items))

    def score_labels(self) -> list[str]:
        return self.labels

    def describe(self) -> dict:
        return {
            "task": self.name,
            "capabilities": sorted(self.capabilities),
            "max_length": self.info.max_length,
            "labels": self.labels,
            "multi_label": self.multi_label,
        }
