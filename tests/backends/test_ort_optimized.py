"""``ort_optimized: true``: ONNX Runtime's optimized graph written ahead of time (core.convert.ort_optimized)
and loaded with the graph optimizations off gives the vectors of the plain graph under full optimization."""

from __future__ import annotations

import numpy as np

from core.config import ModelSpec, Settings
from core.convert.ort_optimized import main, write_optimized
from core.engine import Engine
from core.tasks.embed import EmbedRequest

SETTINGS = Settings(threads=1)


def test_the_optimized_graph_serves_the_same_vectors(minilm_dir, packaged_int8_onnx, sentences, tmp_path, capsys):
    optimized = tmp_path / "model_int8.ort.onnx"
    assert main([str(packaged_int8_onnx), str(optimized)]) == 0
    assert f"wrote {optimized}" in capsys.readouterr().out
    plain = Engine.load(ModelSpec(path=minilm_dir, backend="onnx", dtype="int8", onnx_file=packaged_int8_onnx),
                        SETTINGS, warm_up=False)
    cached = Engine.load(ModelSpec(path=minilm_dir, backend="onnx", dtype="int8", onnx_file=optimized,
                                   ort_optimized=True), SETTINGS, warm_up=False)
    assert cached.backend._session.get_session_options().graph_optimization_level.name == "ORT_DISABLE_ALL"
    assert plain.backend._session.get_session_options().graph_optimization_level.name == "ORT_ENABLE_ALL"
    texts = sentences[:16]
    want = plain.run_sync(EmbedRequest(texts=texts)).vectors
    got = cached.run_sync(EmbedRequest(texts=texts)).vectors
    np.testing.assert_allclose(got, want, atol=1e-5)
    # the written graph is ONNX Runtime's rewrite (fused operators), not a copy
    assert {n.op_type for n in _nodes(optimized)} != {n.op_type for n in _nodes(packaged_int8_onnx)}


def test_written_in_place(packaged_int8_onnx, tmp_path):
    graph = tmp_path / "model.onnx"
    graph.write_bytes(packaged_int8_onnx.read_bytes())
    assert write_optimized(graph, graph) == graph and not list(tmp_path.glob("*.tmp"))
    assert {n.op_type for n in _nodes(graph)} != {n.op_type for n in _nodes(packaged_int8_onnx)}


def _nodes(path):
    import onnx

    return onnx.load(str(path), load_external_data=False).graph.node
