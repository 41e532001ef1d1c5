"""References for chunked embeddings, computed with transformers from a model's token vectors: the windows a
tokenizer makes with ``truncation=True, max_length=size, stride=overlap, return_overflowing_tokens=True``."""

from __future__ import annotations

from typing import Callable

import numpy as np


def normalize(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def window_states(tok, model, text: str, size: int, overlap: int, **options) -> tuple[np.ndarray, dict]:
    """The last hidden states of ``text``'s overflowing windows (padded), and the tokenizer's encoding
    (``options`` go to the tokenizer, e.g. ``return_special_tokens_mask``)."""
    import torch

    enc = tok(text, truncation=True, max_length=size, stride=overlap, return_overflowing_tokens=True,
              padding=True, return_tensors="pt", **options)
    enc.pop("overflow_to_sample_mapping")
    special = enc.pop("special_tokens_mask", None)
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state.numpy()
    if special is not None:
        enc["special_tokens_mask"] = special
    return hidden, enc


def chunked(tok, model, text: str, size: int, overlap: int,
            pool: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> tuple[np.ndarray, int]:
    """One vector for ``text``: each window pooled by ``pool(hidden, mask)`` and normalized, the mean weighted
    by the windows' token counts, re-normalized; and the tokens embedded (overlaps counted twice)."""
    hidden, enc = window_states(tok, model, text, size, overlap)
    mask = enc["attention_mask"].numpy().astype(np.float32)
    windows = normalize(pool(hidden, mask).astype(np.float64))
    weights = mask.sum(1).astype(np.float64)
    return normalize((windows * weights[:, None]).sum(0) / weights.sum()).astype(np.float32), int(weights.sum())


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return (hidden * mask[:, :, None]).sum(1) / mask.sum(1)[:, None]


def cls_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return hidden[:, 0]
