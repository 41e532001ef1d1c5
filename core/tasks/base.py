"""The per-task contract (small, like LitServe's): what a task does before and after the backend.

    prepare(request)            -> items      worker thread: tokenize / decode; each item has .cost
    collate(items)              -> inputs     inference thread: pad a batch into named arrays
    postprocess(outputs, items) -> results    inference thread: one result per item (pooling, scores)
    finish(request, items, results) -> reply  request's own: per-request options (normalize, dimensions)

Items of many requests share a batch; ``finish`` sees only its own request's items and results.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Protocol, Sequence

import numpy as np

from core.tokenization import TextTokenizer, pad_batch


#: capabilities every task of a kind offers beside its main one (never a model's default route)
AUXILIARY_CAPABILITIES = frozenset({"tokenize", "score"})

#: texts up to this many characters in all are tokenized on the event loop (~0.1 ms), not on a worker
INLINE_PREPARE_CHARS = 1000


class Item(Protocol):
    @property
    def cost(self) -> int: ...


class Task(Protocol):
    name: ClassVar[str]
    head: ClassVar[str]
    #: what the task serves, matched by routes through ``Registry.get(model, capability)``:
    #: "embeddings" (/v1/embeddings), later "rerank", "classify", "tokenize", ...
    capabilities: ClassVar[frozenset[str]]

    def prepare(self, request: Any) -> Sequence[Item]: ...

    # optional: ``prepare_inline(request) -> bool``: True when preparing is cheaper than a thread hop
    # (a few short texts), so the engine runs ``prepare`` on the event loop itself

    def collate(self, items: Sequence[Item]) -> Mapping[str, np.ndarray]: ...

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[Item]) -> list[Any]: ...

    def finish(self, request: Any, items: Sequence[Item], results: list[Any]) -> Any: ...

    def describe(self) -> dict: ...


class TextTask:
    """What the text tasks share: the model's tokenizer and right-padding to the batch's longest item."""

    #: no inputs to fetch before ``prepare`` (multi-modal tasks fetch media URLs on the event loop)
    fetches_inputs: ClassVar[bool] = False

    def __init__(self, info, spec) -> None:
        self.info = info
        self.tokenizer = TextTokenizer(info.folder, info.max_length)
        self.pad_multiple = spec.pad_to_multiple_of

    def collate(self, items: Sequence[Item]) -> Mapping[str, np.ndarray]:
        return pad_batch(items, self.tokenizer.pad_id, self.pad_multiple)
