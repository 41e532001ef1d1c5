"""Operations on a batch's vectors that several tasks share: pooling token vectors under the attention mask,
L2 normalization, Matryoshka truncation. numpy only."""

from __future__ import annotations

import numpy as np

from core.errors import InvalidInput


def _masked_sum(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Σ over tokens of ``hidden`` (batch, seq, dim) weighted by ``mask`` (batch, seq): one pass, as a
    (1 × seq) · (seq × dim) product per row for float32/float64 (no (batch, seq, dim) temporary)."""
    if hidden.dtype in (np.float32, np.float64):
        return np.matmul(mask.astype(hidden.dtype)[:, None, :], hidden)[:, 0, :]
    return (hidden * mask[:, :, None].astype(hidden.dtype)).sum(axis=1)


def _pool_one(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    rows = np.arange(hidden.shape[0])
    if mode == "cls":  # the first pooled token (not position 0 when a prompt is left out of pooling)
        return hidden[rows, mask.argmax(axis=1)]
    if mode == "lasttoken":  # the last pooled token; none pooled: a zero vector, as sentence-transformers
        last = hidden.shape[1] - 1 - mask[:, ::-1].argmax(axis=1)
        return hidden[rows, last] * mask[rows, last][:, None].astype(hidden.dtype)
    if mode == "max":
        return np.where(mask[:, :, None] > 0, hidden, np.float32(-1e9)).max(axis=1)
    if mode == "weightedmean":  # weights 1, 2, … by position from the first token (right padding)
        w = mask.astype(hidden.dtype) * np.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype)[None, :]
        return _masked_sum(hidden, w) / np.maximum(w.sum(axis=1, keepdims=True), 1e-9)
    counts = np.maximum(mask.sum(axis=1, keepdims=True).astype(hidden.dtype), 1e-9)
    summed = _masked_sum(hidden, mask)
    if mode == "mean":
        return summed / counts
    if mode == "mean_sqrt_len_tokens":
        return summed / np.sqrt(counts)
    raise InvalidInput(f"unknown pooling mode {mode!r}")


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """Pool token vectors (batch, seq, dim) under an attention mask, as sentence-transformers' Pooling;
    ``mode`` may join several modes with "+" (concatenated in that order)."""
    modes = mode.split("+")
    if len(modes) == 1:
        return _pool_one(hidden, mask, mode)
    return np.concatenate([_pool_one(hidden, mask, m) for m in modes], axis=-1)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norms (at least 1e-12): ``np.linalg.norm``'s sum of squares for real rows, without
    its checks and dispatch (half the cost of a one-row request's normalization; the same values)."""
    norms = np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True))
    return x / np.maximum(norms, 1e-12)


def shape_vectors(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Matryoshka truncation to ``dimensions``, then L2 normalization: contiguous float32 rows."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = l2_normalize(vectors)
    return np.ascontiguousarray(vectors, dtype=np.float32)
