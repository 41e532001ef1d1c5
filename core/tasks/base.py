"""The per-task contract (small, like LitServe's): what a task does before and after the backend.

    prepare(request)            -> items      worker thread: tokenize / decode; each item has .cost
    collate(items)              -> inputs     inference thread: pad a batch into named arrays
    postprocess(outputs, items) -> results    inference thread: one result per item (pooling, scores)
    finish(request, items, results) -> reply  request's own: per-request options (normalize, dimensions)

Items of many requests share a batch; ``finish`` sees only its own request's items and results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol, Sequence

import numpy as np

from core.capabilities import Capability
from core.errors import Unsupported
from core.loading import ModelInfo
from core.tokenization import TextTokenizer, pad_batch

if TYPE_CHECKING:
    from core.backends.base import Backend


#: texts up to this many characters in all are tokenized on the event loop (~0.1 ms), not on a worker
INLINE_PREPARE_CHARS = 1000


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The server's per-request limits a task applies while it plans a request's items (the engine sets
    them from the settings): long-input windows are counted against them before any is built."""

    tokens: int = 262_144  # max_tokens_per_request
    items: int = 2048  # max_items_per_request
    response_bytes: int = 32 * 1024 * 1024  # max_response_bytes


@dataclass(slots=True)
class ScoreResult:
    """One score per document (rerank, late-interaction MaxSim), in input order."""

    scores: np.ndarray  # float32 (n,)
    prompt_tokens: int


class Item(Protocol):
    @property
    def cost(self) -> int: ...


class Task:
    """The base every task derives from. Subclasses set the class attributes and implement
    ``prepare``/``collate``/``postprocess``/``finish``; the other hooks have these defaults."""

    name: ClassVar[str]
    head: ClassVar[str]
    #: what the task serves, matched by routes through ``Registry.get(model, capability)`` (core/capabilities.py)
    capabilities: ClassVar[frozenset[Capability]]
    #: the inputs it embeds (``/v1/models`` shows them; a request in another modality is refused)
    modalities: ClassVar[tuple[str, ...]] = ("text",)
    #: what the model folder says (pooling, max length, config)
    info: ModelInfo

    #: True: the engine awaits ``fetch_inputs`` on the event loop before ``prepare`` (media URLs); a flag,
    #: so tasks without inputs to fetch cost no extra await on the hot path
    fetches_inputs: ClassVar[bool] = False
    #: True: the task honours ``truncation_direction="left"`` (keeps the end of an over-long text);
    #: the serving layer refuses "left" for the others
    truncates_left: ClassVar[bool] = False
    #: True: the task embeds long texts in windows (a request's ``chunking``, a spec's default); the
    #: others refuse both (core/tasks/chunking.py)
    chunks: ClassVar[bool] = False
    #: the server's per-request limits (``Engine`` sets the settings' own; defaults are the settings' defaults)
    limits: RequestLimits = RequestLimits()

    async def fetch_inputs(self, request: Any) -> None:
        """Fetch what ``prepare`` needs from the network (only called when ``fetches_inputs``)."""

    def prepare(self, request: Any) -> Sequence[Item]:
        raise NotImplementedError

    def prepare_inline(self, request: Any) -> bool:
        """True when preparing is cheaper than a thread hop (a few short texts): the engine then runs
        ``prepare`` on the event loop itself."""
        return False

    def answer_values(self, request: Any, items: Sequence[Item]) -> int | None:
        """How many values the answer will hold when it grows with the tokens (a vector per token); None:
        one result per item, which the item limit bounds. The engine refuses, before any inference, a
        request whose answer cannot fit ``limits.response_bytes``."""
        return None

    def batch_group(self, request: Any) -> str | None:
        """A key that items must share to meet in a batch (e.g. the modality); None: one group."""
        return None

    def collate(self, items: Sequence[Item]) -> Mapping[str, np.ndarray]:
        raise NotImplementedError

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[Item]) -> list[Any]:
        raise NotImplementedError

    def finish(self, request: Any, items: Sequence[Item], results: list[Any]) -> Any:
        raise NotImplementedError

    def shape(self, vectors: np.ndarray, request: Any) -> np.ndarray:
        """Single-vector embedding tasks: the request's ``dimensions`` and ``normalize`` applied to full,
        unnormalized vectors (what ``finish`` does; the int8/uint8 calibration reuses it)."""
        raise Unsupported(f"the {self.name} task returns no single-vector embeddings")

    def describe(self) -> dict:
        """What ``/v1/models`` shows of the task."""
        return {"task": self.name}

    def score_labels(self) -> list[str]:
        """The labels of the task's scores, by index (TEI's ``/info`` id2label); none by default."""
        return []

    def check_backend(self, backend: "Backend") -> None:
        """Raise ``Unsupported`` when the chosen backend (built, not loaded) cannot compute what this task needs
        of the model, as its declarations say (checked at load, before the backend loads); every backend by
        default."""

    def warmup_batches(self, batch_tokens: int, max_batch_size: int) -> list[Mapping[str, np.ndarray]]:
        """Backend inputs of one batch per shape class the batcher will form (run once at load, before
        the model serves); none by default."""
        return []


def warmup_lengths(max_length: int) -> list[int]:
    """Length buckets a warm-up covers: 8, 16, 32, … up to the model's maximum (and the maximum itself)."""
    lengths, length = [], 8
    while length < max_length:
        lengths.append(length)
        length *= 2
    return lengths + [max_length]


def warmup_count(cost: int, batch_tokens: int, max_batch_size: int) -> int:
    """Items of ``cost`` padded tokens in a full batch: as many as the token budget and the batch size allow."""
    return max(1, min(max_batch_size, batch_tokens // max(cost, 1)))


class TextTask(Task):
    """What the text tasks share: the model's tokenizer and right-padding to the batch's longest item."""

    def __init__(self, info, spec) -> None:
        self.info = info
        self.spec = spec
        self.tokenizer = TextTokenizer(info.folder, info.max_length)
        self.pad_multiple = spec.pad_to_multiple_of

    def collate(self, items: Sequence[Item]) -> Mapping[str, np.ndarray]:
        return pad_batch(items, self.tokenizer.pad_id, self.pad_multiple)

    def warmup_batches(self, batch_tokens: int, max_batch_size: int) -> list[Mapping[str, np.ndarray]]:
        """A lone short text, then a full batch per length bucket, of real token ids (a tokenized filler
        word between the model's own special tokens)."""
        from core.tokenization import Encoded

        (sample,) = self.tokenizer.encode(["warm up"], truncate=True)
        ids = sample.ids
        head, tail, word = ids[:1], ids[-1:], ids[1:-1] if ids.size > 2 else ids

        def item(length: int) -> Encoded:
            body = np.resize(word, max(length - 2, 0))
            row = np.concatenate([head, body, tail])[:length]
            return Encoded(row.astype(np.int64), np.zeros_like(row, dtype=np.int64))

        shapes = [(1, min(8, self.tokenizer.max_length))]
        shapes += [(warmup_count(n, batch_tokens, max_batch_size), n) for n in warmup_lengths(self.tokenizer.max_length)]
        return [self.collate([item(length)] * count) for count, length in shapes]
