"""Per-batch forms of per-item work, held to the per-item forms they replace: a matrix's rows as base64
(``encode_rows`` against ``encode_vector`` row by row) and a batch's queue times into a histogram
(``observe_each`` against ``Histogram.observe`` value by value)."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from core.api.embeddings.encode import encode_rows, encode_vector
from core.metrics import _TIME_BUCKETS, observe_each


@pytest.mark.parametrize("dim", [1, 2, 3, 5, 8, 32, 384, 1024])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_rows_as_base64_are_each_rows_own(dim, dtype):
    rng = np.random.default_rng(dim)
    vectors = rng.standard_normal((7, dim)).astype(dtype)
    rows = encode_rows(vectors, "base64")
    assert rows == [encode_vector(v, "base64") for v in vectors]
    decoded = np.stack([np.frombuffer(base64.b64decode(r), "<f4") for r in rows])
    np.testing.assert_array_equal(decoded, vectors.astype(np.float32))
    strided = vectors[:, ::-1] if dim > 1 else vectors[::2]  # not contiguous
    assert encode_rows(strided, "base64") == [encode_vector(v, "base64") for v in strided]


def test_other_shapes_and_formats_go_row_by_row():
    assert encode_rows(np.zeros((0, 4), np.float32), "base64") == []
    ints = np.arange(12, dtype=np.int8).reshape(3, 4)
    assert encode_rows(ints, "base64") == [encode_vector(v, "base64") for v in ints]
    assert encode_rows(ints, "base64_packed") == [encode_vector(v, "base64_packed") for v in ints]
    floats = np.ones((2, 3), np.float32)
    assert [r.tolist() for r in encode_rows(floats, "float")] == floats.tolist()
    multi = [np.ones((2, 3), np.float32), np.zeros((1, 3), np.float32)]  # a vector per token
    assert encode_rows(multi, "base64") == [encode_vector(v, "base64") for v in multi]


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_batch_of_observations_is_the_same_histogram():
    rng = np.random.default_rng(0)
    values = [*_TIME_BUCKETS, 0.0, -1.0, 1e-9, 99.0, math.inf, math.nan,
              *rng.exponential(0.05, 300).tolist(), *(b + 1e-12 for b in _TIME_BUCKETS)]
    one, many = CollectorRegistry(), CollectorRegistry()
    one_by_one = Histogram("q", "queue", ["model"], buckets=_TIME_BUCKETS, registry=one).labels("m")
    batched = Histogram("q", "queue", ["model"], buckets=_TIME_BUCKETS, registry=many).labels("m")
    for value in values:
        one_by_one.observe(value)
    observe_each(batched, values)
    observe_each(batched, [])
    lines = _exposition(many)
    assert lines == _exposition(one)
    assert 'q_count{model="m"} %s' % float(len(values) - 1) in lines  # the NaN in no bucket, as observe does
