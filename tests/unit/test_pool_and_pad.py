"""The vectorized pooling and padding against the plain per-row definitions they replace (random shapes,
rows of every length, a row with no pooled token (float32/64), float16 hidden states on the element-wise path)."""

from __future__ import annotations

import numpy as np
import pytest

from core.tasks.vectors import pool
from core.tokenization import PAD_ROWS_VECTORIZED, Encoded, pad_batch


def _reference(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    out = []
    for h, m in zip(hidden.astype(np.float64), mask.astype(bool)):
        rows = h[m]
        if mode == "mean":
            out.append(rows.sum(axis=0) / max(len(rows), 1e-9))
        elif mode == "mean_sqrt_len_tokens":
            out.append(rows.sum(axis=0) / np.sqrt(max(len(rows), 1e-9)))
        elif mode == "weightedmean":
            w = np.arange(1, h.shape[0] + 1)[m]
            out.append((rows * w[:, None]).sum(axis=0) / max(w.sum(), 1e-9))
        elif mode == "max":
            out.append(rows.max(axis=0) if len(rows) else np.full(h.shape[1], -1e9))
    return np.asarray(out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("mode", ["mean", "mean_sqrt_len_tokens", "weightedmean", "max"])
def test_pooling_matches_the_per_row_definition(mode, dtype):
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((9, 13, 6)).astype(dtype)
    # a row with no pooled token only in float32/64: float16 has no 1e-9 (0/0) nor -1e9 (-inf)
    lengths = np.array([13, 1, 5, 0 if dtype != np.float16 else 4, 7, 12, 3, 13, 2])
    mask = np.arange(13)[None, :] < lengths[:, None]
    mask[2, :2] = False  # a prompt left out of pooling
    want = _reference(hidden, mask, mode)
    tol = 1e-2 if dtype == np.float16 else 1e-5
    for m in (mask, mask.astype(np.int64)):  # a boolean mask, and the 0/1 integers other tasks pass
        got = pool(hidden, m, mode)
        # max's -1e9 filler is float32, so float16 states come out float32 (the tasks cast to float32 anyway)
        assert got.dtype == (np.float32 if mode == "max" and dtype == np.float16 else dtype)
        assert got.shape == (9, 6)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("rows", [(4, 1, 11, 7, 11, 2), (4, 1, 11, 7, 11, 2) * 3 + (9, 3)])  # row copies; masked
@pytest.mark.parametrize("multiple_of", [1, 8])
def test_pad_batch_places_each_row_and_pads_the_rest(rows, multiple_of):
    assert (len(rows) < PAD_ROWS_VECTORIZED) == (len(rows) == 6)
    rng = np.random.default_rng(3)
    items = [Encoded(rng.integers(5, 30000, n).astype(np.int64), rng.integers(0, 2, n).astype(np.int64))
             for n in rows]
    batch = pad_batch(items, pad_id=1, multiple_of=multiple_of)
    width = 11 if multiple_of == 1 else 16
    assert {k: v.shape for k, v in batch.items()} == {k: (len(rows), width) for k in batch}
    assert all(v.dtype == np.int64 for v in batch.values())
    for row, item in enumerate(items):
        n = item.cost
        assert batch["input_ids"][row, :n].tolist() == item.ids.tolist()
        assert batch["token_type_ids"][row, :n].tolist() == item.type_ids.tolist()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
        assert (batch["input_ids"][row, n:] == 1).all() and (batch["token_type_ids"][row, n:] == 0).all()
