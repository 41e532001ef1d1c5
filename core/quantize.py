"""Quantized embedding outputs (``embedding_type``), with sentence-transformers' ``quantize_embeddings``
arithmetic:

- ``int8`` / ``uint8``: per dimension, the range [min, max] of a calibration set is cut into 255 steps;
  a value maps to ``floor((x - min) / step)`` clipped to 0..255 (``uint8``), minus 128 (``int8``).
- ``binary`` / ``ubinary``: one bit per dimension (``x > 0``), packed 8 to a byte, big-endian within the
  byte (``numpy.packbits``); ``binary`` stores each byte minus 128 as int8.

Calibration: sentence-transformers, given no calibration set, takes the min/max of the embeddings being
quantized — which makes a vector depend on the other vectors of its request. A server cannot do that
(batched must equal single), so each model is calibrated once, on first use, with the fixed, varied
texts of :data:`CALIBRATION_TEXTS`, embedded by the model itself (once, full dimension, unnormalized);
the ranges for a request's ``dimensions`` and ``normalize`` are taken from those vectors as the task
finishes them (:class:`Calibration`).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import numpy as np

from core.errors import InvalidInput

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary")

_SUBJECTS = ["The committee", "A small dog", "Our new database", "The river", "My grandmother", "This paper",
             "The stock market", "A quantum computer", "The football team", "Le gouvernement", "Das Wetter",
             "El restaurante"]
_VERBS = ["announced", "ignored", "improved", "crossed", "cooked", "describes", "collapsed", "simulates",
          "celebrated", "a annoncé", "ist", "sirve"]
_OBJECTS = ["a plan to reduce emissions by 2030.", "the mailman every morning.", "query latency by half.",
            "the valley after the storm.", "soup for the whole family.", "a method for sparse retrieval.",
            "after the interest rate decision.", "molecules with many atoms.", "a late victory at home.",
            "une nouvelle réforme.", "heute sonnig und warm.", "comida deliciosa."]

#: 144 fixed, varied sentences (topics, lengths, languages): the calibration set of int8/uint8 outputs
CALIBRATION_TEXTS: tuple[str, ...] = tuple(
    (f"{s} {v} {_OBJECTS[(i + j) % len(_OBJECTS)]}" + (" Moreover, it was widely reported." * (j % 4)))
    for i, s in enumerate(_SUBJECTS)
    for j, v in enumerate(_VERBS)
)


def ranges_of(calibration: np.ndarray) -> np.ndarray:
    """(2, dim): per-dimension min and max of the calibration embeddings."""
    return np.vstack((calibration.min(axis=0), calibration.max(axis=0))).astype(np.float32)


def quantize(vectors: np.ndarray, embedding_type: str, ranges: np.ndarray | None = None) -> np.ndarray:
    if embedding_type == "float":
        return vectors
    if embedding_type in ("int8", "uint8"):
        if ranges is None:
            raise ValueError("int8/uint8 need calibration ranges")
        starts = ranges[0]
        steps = (ranges[1] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        levels = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        return levels.astype(np.uint8) if embedding_type == "uint8" else (levels - 128).astype(np.int8)
    if embedding_type == "binary":
        return (np.packbits(vectors > 0, axis=-1) - 128).astype(np.int8)
    if embedding_type == "ubinary":
        return np.packbits(vectors > 0, axis=-1)
    raise InvalidInput(f"embedding_type must be one of {EMBEDDING_TYPES}", param="embedding_type")


class Calibration:
    """One model's calibration set, embedded once, at full dimension and not normalized. The ranges for
    a request's ``dimensions`` and ``normalize`` are derived from these vectors by the task's own
    finishing step (``Task.shape``), so no pair of options costs another pass over the set."""

    def __init__(self) -> None:
        self._vectors: np.ndarray | None = None
        self._lock = asyncio.Lock()

    async def vectors(self, embed: Callable[[], Awaitable[np.ndarray]]) -> np.ndarray:
        if self._vectors is None:
            async with self._lock:
                if self._vectors is None:
                    self._vectors = await embed()
        return self._vectors
