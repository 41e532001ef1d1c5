"""The plain in-process ONNX Runtime loop (benchmarks.plain_ort; scripts/compare_infinity.py --plain) is
the denominator of the "Tessera/plain" ratio in docs/benchmarks.md: it must compute the same
embeddings as the reference, or the ratio means nothing."""

from __future__ import annotations

import numpy as np

from benchmarks.plain_ort import plain_ort_embedder, plain_ort_loop


def test_plain_embedder_matches_sentence_transformers(minilm_onnx_dir, minilm_dir, st_minilm, sentences):
    embed = plain_ort_embedder(minilm_onnx_dir / "onnx" / "model.onnx", minilm_dir / "tokenizer.json", threads=1)
    got = embed(sentences)
    want = st_minilm.encode(sentences, normalize_embeddings=True)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-4)


def test_plain_loop_reports_a_positive_rate(minilm_onnx_dir, minilm_dir, sentences):
    rate = plain_ort_loop(minilm_onnx_dir / "onnx" / "model.onnx", minilm_dir / "tokenizer.json",
                          sentences, batch=2, duration=0.2, threads=1)
    assert rate > 0
