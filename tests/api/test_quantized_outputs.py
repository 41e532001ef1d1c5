"""embedding_type int8/uint8/binary/ubinary: equal to sentence-transformers' quantize_embeddings on the
same vectors (with the fixed calibration set), bit-exact, in float and base64 encodings, with dimensions."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from core.quantize import CALIBRATION_TEXTS
from tests.api.conftest import assert_error

TEXTS = ["int8 embeddings save memory", "Binary vectors are compared with Hamming distance.",
         "Ein deutscher Satz.", "x", "word " * 300]
DTYPES = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}


def st_quantize(vectors, precision, calibration):
    from sentence_transformers.util.quantization import quantize_embeddings

    return quantize_embeddings(vectors, precision=precision, calibration_embeddings=calibration)


def floats(client, texts, **extra):
    r = client.post("/v1/embeddings", json={"input": texts, **extra})
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def quantized(client, texts, embedding_type, encoding="float", **extra):
    r = client.post("/v1/embeddings", json={"input": texts, "embedding_type": embedding_type,
                                            "encoding_format": encoding, **extra})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    if encoding == "base64_packed":  # the raw bytes
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=DTYPES[embedding_type]) for d in data])
    if encoding == "base64":  # float32 holding the integer values (what the OpenAI SDK decodes)
        values = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data])
        assert np.array_equal(values, np.round(values))
        return values.astype(DTYPES[embedding_type])
    return np.array([d["embedding"] for d in data], dtype=DTYPES[embedding_type])


@pytest.mark.parametrize("embedding_type", ["int8", "uint8", "binary", "ubinary"])
@pytest.mark.parametrize("encoding", ["float", "base64", "base64_packed"])
def test_equals_sentence_transformers_quantization(one_model, embedding_type, encoding):
    vectors = floats(one_model, TEXTS)
    calibration = floats(one_model, list(CALIBRATION_TEXTS))
    expected = st_quantize(vectors, embedding_type, calibration)
    got = quantized(one_model, TEXTS, embedding_type, encoding)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_binary_packing_is_bit_exact(one_model):
    vectors = floats(one_model, TEXTS)
    got = quantized(one_model, TEXTS, "ubinary")
    assert got.shape == (len(TEXTS), 384 // 8)
    np.testing.assert_array_equal(np.unpackbits(got, axis=-1).astype(bool), vectors > 0)
    signed = quantized(one_model, TEXTS, "binary")
    np.testing.assert_array_equal(signed.astype(np.int16) + 128, got.astype(np.int16))


@pytest.mark.parametrize("embedding_type", ["int8", "ubinary"])
def test_with_dimensions(one_model, embedding_type):
    vectors = floats(one_model, TEXTS, dimensions=128)
    calibration = floats(one_model, list(CALIBRATION_TEXTS), dimensions=128)
    got = quantized(one_model, TEXTS, embedding_type, dimensions=128)
    np.testing.assert_array_equal(got, st_quantize(vectors, embedding_type, calibration))
    assert got.shape[1] == (128 if embedding_type == "int8" else 16)


def test_batched_equals_single(one_model):
    batched = quantized(one_model, TEXTS, "int8")
    singles = np.concatenate([quantized(one_model, [t], "int8") for t in TEXTS])
    np.testing.assert_array_equal(batched, singles)


def test_close_to_the_reference_models_own_vectors(one_model, st_minilm):
    """Against sentence-transformers end to end (its vectors, its calibration): at most one level apart."""
    ref = st_quantize(st_minilm.encode(TEXTS), "int8", st_minilm.encode(list(CALIBRATION_TEXTS)))
    got = quantized(one_model, TEXTS, "int8")
    assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1


def test_model_default_and_bad_values(minilm_onnx_dir):
    from tests.api.conftest import client_for

    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m", "embedding_dtype": "ubinary"}]) as c:
        r = c.post("/v1/embeddings", json={"input": "default type"})
        assert len(r.json()["data"][0]["embedding"]) == 48
        r = c.post("/v1/embeddings", json={"input": "asked float", "embedding_type": "float"})
        assert len(r.json()["data"][0]["embedding"]) == 384
        assert_error(c.post("/v1/embeddings", json={"input": "x", "embedding_type": "int4"}), 422)


def test_the_calibration_set_is_embedded_once_per_model_whatever_the_options(minilm_onnx_dir):
    """Each new (dimensions, normalize) pair used to embed the 144 calibration texts again (up to ~1,100
    pairs per model): now the set is embedded once, and every pair's ranges come from those vectors as
    the task finishes them (still equal to sentence-transformers' quantization of that pair's vectors)."""
    from tests.api.conftest import client_for

    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}]) as c:
        backend = c.app.state.registry.engines["m"].backend
        run = backend.run
        items = []

        def counting(inputs):
            items.append(len(inputs["input_ids"]))
            return run(inputs)

        backend.run = counting
        quantized(c, TEXTS[:1], "int8")
        assert sum(items) == 1 + len(CALIBRATION_TEXTS)
        pairs = [(d, n) for d in (None, 16, 100, 383) for n in (None, True, False)]
        for dimensions, normalize in pairs:
            items.clear()
            options = {"dimensions": dimensions, "normalize": normalize}
            options = {k: v for k, v in options.items() if v is not None}
            got = quantized(c, TEXTS, "uint8", **options)
            assert sum(items) == len(TEXTS), (dimensions, normalize)  # the request's own texts only
            backend.run = run
            calibration = floats(c, list(CALIBRATION_TEXTS), **options)
            np.testing.assert_array_equal(got, st_quantize(floats(c, TEXTS, **options), "uint8", calibration))
            backend.run = counting
