"""Activations on logits, shared by the tasks that turn logits into scores (rerank, classify)."""

from __future__ import annotations

from typing import Any

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def cross_encoder_activation(config: dict[str, Any], st_config: dict[str, Any]) -> str:
    """The activation sentence-transformers' CrossEncoder applies for one label: the one recorded in
    config_sentence_transformers.json (v5+) or config.json (``sentence_transformers.activation_fn``, or the
    older ``sbert_ce_default_activation_function``), else sigmoid. Returns ``"sigmoid"`` or ``"identity"``."""
    path = (
        st_config.get("activation_fn")
        or (config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function")
    )
    if path and path.rsplit(".", 1)[-1] == "Identity":
        return "identity"
    return "sigmoid"
