"""Long inputs for the embed task: texts longer than the model's window.

- **Chunking** (``ChunkOptions``): each text is split into windows of ``size`` tokens (special tokens
  included; default: the model's max length) that overlap by ``overlap`` tokens — the windows transformers'
  tokenizers make with ``truncation=True, max_length=size, stride=overlap, return_overflowing_tokens=True`` —
  each window is embedded as a text of its own (the model's pooling, Dense modules, normalization, dimensions),
  and the text's vector is the mean of its windows' vectors weighted by their token counts, re-normalized when
  the embedding is normalized. ``usage`` counts every token embedded (overlaps twice).
- **Late chunking** (``LateChunkOptions``, Jina's definition): one context (a text with character spans, or
  a list of chunks joined by ``separator``) runs through the model once — in consecutive windows of the
  model's max length when it is longer, each token's vector taken from the first window that holds it — and
  each chunk's vector is the mean of the token vectors of its span (a token belongs to every span its
  characters overlap; special tokens never), then the model's Dense modules and normalization. One vector per
  chunk.

Both plan their windows in ``prepare`` (items carry what ``finish`` needs to reassemble them) and share
batches with ordinary items."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from core.errors import InvalidInput, TooLarge
from core.tasks.vectors import l2_normalize
from core.tokenization import Encoded, unencodable


@dataclass(slots=True)
class ChunkOptions:
    size: int | None = None  # tokens per window, special tokens included; None: the model's max length
    overlap: int = 0  # tokens shared by consecutive windows


@dataclass(slots=True)
class LateChunkOptions:
    #: character spans [start, end) of the chunks in the (single) input text; None: the inputs are the
    #: chunks, joined by ``separator`` into one context
    spans: list[tuple[int, int]] | None = None
    separator: str = " "
    overlap: int = 0  # tokens shared by consecutive windows of a context over the model's length


@dataclass(slots=True)
class Window(Encoded):
    """One window of a chunked text: embedded (pooled) as an ordinary item; ``text`` is its text's index."""

    text: int = 0


@dataclass(slots=True)
class LateWindow(Encoded):
    """One window of a late-chunked context: its result is the token vectors at ``keep`` (positions in the
    window of the context tokens no earlier window held); the first window carries every chunk's token
    indices in the context (``chunks``)."""

    keep: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    chunks: list[np.ndarray] | None = None


def long_input_options(chunking: Any, late_chunking: Any) -> tuple[ChunkOptions | bool | None, LateChunkOptions | None]:
    """The request's options (wire models or dicts with the same fields; ``late_chunking: true``: the inputs
    are the chunks) as the task's."""
    def fields(value) -> dict:
        return dict(value.model_dump() if hasattr(value, "model_dump") else value)

    if chunking is None or isinstance(chunking, bool):
        chunk = chunking  # None: the model's default; True: on (the default's windows, or the max length); False: off
    else:
        chunk = ChunkOptions(**fields(chunking))
    if late_chunking is None or late_chunking is False:
        late = None
    elif late_chunking is True:
        late = LateChunkOptions()
    else:
        late = LateChunkOptions(**fields(late_chunking))
        if late.spans is not None:
            if any(len(span) != 2 for span in late.spans):
                raise InvalidInput("late_chunking.spans: each span is [start, end]", param="late_chunking")
            late.spans = [(int(s), int(e)) for s, e in late.spans]
    return chunk, late


def in_force(task, request) -> ChunkOptions | None:
    """The windows a text embedding request is embedded in: its own ``chunking``, else the model's default
    (the spec's ``chunking``) when the request could take it (text input, no prompt, no late chunking);
    ``chunking: false`` turns the default off, ``true`` turns it on (the default's windows, or the model's
    max length)."""
    asked, default = request.chunking, task.spec.chunking
    if asked is False:
        return None
    if asked is True:
        return ChunkOptions(default.size, default.overlap) if default is not None else ChunkOptions()
    if asked is not None:
        return asked
    if default is None or request.output != "pooled" or request.texts is None or request.token_ids is not None \
            or request.late_chunking is not None or request.prompt is not None or request.prompt_name is not None:
        return None
    return ChunkOptions(default.size, default.overlap)


def check_default(task, spec) -> None:
    """A spec's ``chunking`` default is refused at load where no request could be served with it: a task
    that does not chunk, or a model with a default prompt (chunking does not combine with prompts)."""
    if spec.chunking is None:
        return
    if not task.chunks:
        raise InvalidInput(f"model {spec.served_name!r}: a chunking default is offered for text embedding models; "
                           f"this model's task is {task.name!r}", param="chunking")
    if spec.default_prompt_name or task.info.default_prompt_name:
        raise InvalidInput(f"model {spec.served_name!r}: a chunking default does not combine with the model's "
                           "default prompt (chunking does not combine with prompts)", param="chunking")


def refuse_long_input_options(request, task_name: str) -> None:
    """Tasks that do not chunk refuse a request asking for it, never serve it unchunked (``chunking:
    false`` asks for nothing)."""
    for param in ("chunking", "late_chunking"):
        if getattr(request, param, None) not in (None, False):
            raise InvalidInput(f"{param} is offered for single-vector text embedding models; this model's task is "
                               f"{task_name!r}", param=param)


def _encode(tok, texts: list[str]):
    try:
        return tok.encode_batch(texts, add_special_tokens=False)
    except TypeError:
        error = unencodable(texts, "input")
        if error is None:
            raise
        raise error from None


def _check_window_shape(size: int, overlap: int, specials: int, param: str) -> None:
    content = size - specials
    if content <= 0:
        raise InvalidInput(f"{param}: size {size} leaves no room for the model's {specials} special tokens",
                           param=param)
    if not 0 <= overlap < content:
        raise InvalidInput(f"{param}: overlap must be at least 0 and less than the {content} text tokens of a "
                           f"window (size {size} less {specials} special tokens)", param=param)


def _windows(tok, encoding, size: int, overlap: int, param: str) -> list:
    """The encoding cut into windows of ``size`` tokens with the special tokens added (overlapping by
    ``overlap``), as a tokenizer's truncation with ``stride`` returns them (the first and its overflowing)."""
    specials = tok.num_special_tokens_to_add(False)
    _check_window_shape(size, overlap, specials, param)
    encoding.truncate(size - specials, stride=overlap)
    return [tok.post_process(w, add_special_tokens=True) for w in [encoding, *encoding.overflowing]]


def window_plan(tokens: int, content: int, overlap: int, specials: int) -> tuple[int, int]:
    """(windows, tokens embedded) of a text of ``tokens`` tokens cut into windows of ``content`` text
    tokens overlapping by ``overlap``, each with ``specials`` special tokens: what ``_windows`` builds,
    computed without building it."""
    if tokens <= content:
        return 1, tokens + specials
    step = content - overlap
    windows = 1 + -(-(tokens - content) // step)
    last = tokens - (windows - 1) * step  # the last window holds the rest
    return windows, (windows - 1) * content + last + windows * specials


class WindowBudget:
    """The windows a request's texts are cut into, counted against the request's limits (tokens embedded,
    ``max_tokens_per_request``; windows as items, ``max_items_per_request``) before any window is built:
    a 1-token stride over a long text would otherwise build tens of thousands of windows first."""

    def __init__(self, limits, param: str):
        self.limits, self.param = limits, param
        self.windows = self.tokens = 0

    def add(self, tokens: int, content: int, overlap: int, specials: int, what: str) -> None:
        windows, embedded = window_plan(tokens, content, overlap, specials)
        self.windows += windows
        self.tokens += embedded
        if self.tokens > self.limits.tokens:
            raise TooLarge(f"{self.param}: {what} makes {windows} windows ({embedded} tokens to embed, {self.tokens} "
                           f"in the request so far); the limit is {self.limits.tokens} tokens per request: use "
                           "larger windows or less overlap", param=self.param, code="too_many_tokens")
        if self.windows > self.limits.items:
            raise TooLarge(f"{self.param}: {what} makes {windows} windows ({self.windows} in the request so far); "
                           f"each window is an item and the limit is {self.limits.items} per request: use larger "
                           "windows or less overlap", param=self.param, code="too_many_windows")


def _check(task, request) -> None:
    if request.token_ids is not None or request.texts is None:
        raise InvalidInput("chunking and late_chunking take text input, not token ids", param="input")
    if request.prompt is not None or request.prompt_name is not None or task.spec.default_prompt_name \
            or task.info.default_prompt_name:
        raise InvalidInput("chunking and late_chunking do not combine with prompts (the model has a default "
                           "prompt, or the request names one)", param="prompt")
    if request.chunking is not None and request.late_chunking is not None:
        raise InvalidInput("use either chunking or late_chunking, not both", param="chunking")


def prepare_chunked(task, request) -> list[Window]:
    _check(task, request)
    options: ChunkOptions = request.chunking
    size = task.info.max_length if options.size is None else options.size
    if not 0 < size <= task.info.max_length:
        raise InvalidInput(f"chunking.size must be between 1 and the model's max length {task.info.max_length}",
                           param="chunking")
    tok = task.tokenizer.untruncated
    encodings = _encode(tok, list(request.texts))
    specials = tok.num_special_tokens_to_add(False)
    _check_window_shape(size, options.overlap, specials, "chunking")
    budget = WindowBudget(task.limits, "chunking")
    for i, enc in enumerate(encodings):
        budget.add(len(enc.ids), size - specials, options.overlap, specials, f"input[{i}]")
    items: list[Window] = []
    for i, enc in enumerate(encodings):
        for w in _windows(tok, enc, size, options.overlap, "chunking"):
            ids = np.asarray(w.ids, dtype=np.int64)
            items.append(Window(ids, np.asarray(w.type_ids, dtype=np.int64), text=i))
    return items


def finish_chunked(request, items: Sequence[Window], vectors: np.ndarray, normalize: bool) -> np.ndarray:
    """Per text: the token-weighted mean of its windows' vectors (already normalized when ``normalize``),
    re-normalized."""
    groups = np.fromiter((it.text for it in items), dtype=np.int64, count=len(items))
    weights = np.fromiter((it.cost for it in items), dtype=np.float64, count=len(items))
    out = np.zeros((len(request.texts), vectors.shape[1]), dtype=np.float64)
    np.add.at(out, groups, vectors.astype(np.float64) * weights[:, None])
    out /= np.bincount(groups, weights=weights, minlength=len(request.texts))[:, None]
    out = out.astype(np.float32)
    return l2_normalize(out) if normalize else out


def _context(request) -> tuple[str, list[tuple[int, int]]]:
    options: LateChunkOptions = request.late_chunking
    texts = list(request.texts)
    if options.spans is None:
        if not texts or any(not t for t in texts):
            raise InvalidInput("late_chunking: each input is a chunk and must not be empty", param="input")
        spans, at = [], 0
        for t in texts:
            spans.append((at, at + len(t)))
            at += len(t) + len(options.separator)
        return options.separator.join(texts), spans
    if len(texts) != 1:
        raise InvalidInput("late_chunking with spans takes one input text (the context the spans point into)",
                       param="input")
    text = texts[0]
    if not options.spans:
        raise InvalidInput("late_chunking.spans must not be empty", param="late_chunking")
    for j, (start, end) in enumerate(options.spans):
        if not 0 <= start < end <= len(text):
            raise InvalidInput(f"late_chunking.spans[{j}]: [{start}, {end}) is not a span of the {len(text)}-"
                               "character input", param="late_chunking")
    return text, [(int(s), int(e)) for s, e in options.spans]


def prepare_late(task, request) -> list[LateWindow]:
    _check(task, request)
    text, spans = _context(request)
    tok = task.tokenizer.untruncated
    (enc,) = _encode(tok, [text])
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
    overlap = request.late_chunking.overlap
    specials = tok.num_special_tokens_to_add(False)
    _check_window_shape(task.info.max_length, overlap, specials, "late_chunking")
    WindowBudget(task.limits, "late_chunking").add(len(offsets), task.info.max_length - specials, overlap, specials,
                                                   "the context")
    chunks = []
    for j, (start, end) in enumerate(spans):
        inside = np.nonzero((offsets[:, 0] < end) & (offsets[:, 1] > start))[0]
        if inside.size == 0:
            raise InvalidInput(f"late_chunking: chunk {j} ([{start}, {end})) holds no token", param="late_chunking")
        chunks.append(inside)
    items: list[LateWindow] = []
    held = 0  # context tokens the windows so far hold
    step = task.info.max_length - specials - overlap
    for k, w in enumerate(_windows(tok, enc, task.info.max_length, overlap, "late_chunking")):
        content = np.nonzero(np.asarray(w.special_tokens_mask) == 0)[0]
        keep = content[max(0, held - k * step):]  # window k starts at context token k * step
        held += keep.size
        items.append(LateWindow(np.asarray(w.ids, dtype=np.int64), np.asarray(w.type_ids, dtype=np.int64),
                                keep=keep, chunks=chunks if not items else None))
    if held != len(offsets):
        raise InvalidInput("late_chunking: the context's windows do not cover its tokens", param="late_chunking")
    return items


def finish_late(task, items: Sequence[LateWindow], token_vectors: list[np.ndarray]) -> np.ndarray:
    """Each chunk's vector: the mean of its span's token vectors, then the model's Dense steps."""
    tokens = np.concatenate(token_vectors, axis=0).astype(np.float32, copy=False)
    pooled = np.stack([tokens[idx].mean(axis=0) for idx in items[0].chunks]).astype(np.float32)
    for step in task.steps:  # Dense modules (and a Normalize between them), as after the model's pooling
        pooled = l2_normalize(pooled) if step == "normalize" else step(pooled)
    return pooled
