"""Torch and ONNX precisions/providers: what loads here and the clear refusals for what cannot.
Parity of each loadable cell with sentence-transformers is the parity matrix (tests/parity/)."""

from __future__ import annotations

import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import InvalidInput

SETTINGS = Settings(threads=2)


@pytest.mark.parametrize("kw,message", [
    ({"dtype": "float16"}, "float16 on CPU is not supported by the torch backend"),
    ({"dtype": "int8", "device": "cuda"}, "CUDA is not available|int8 .* CPU only"),
    ({"dtype": "int4"}, "not supported"),
])
def test_torch_refusals(minilm_dir, kw, message):
    with pytest.raises(InvalidInput, match=message):
        Engine.load(ModelSpec(path=minilm_dir, backend="torch", **kw), SETTINGS)


@pytest.mark.parametrize("kw,message", [
    ({"dtype": "float16"}, "no fp16 ONNX graph.*--fp16"),
    ({"dtype": "bfloat16"}, "not supported"),
    ({"device": "cuda"}, r"\['CUDAExecutionProvider'\] are not in this onnxruntime.*onnxruntime-gpu"),
    ({"providers": ["TensorrtExecutionProvider", "CPUExecutionProvider"]}, "TensorrtExecutionProvider"),
    ({"dtype": "float16", "device": "cuda"}, "no fp16 ONNX graph"),
])
def test_onnx_refusals(minilm_onnx_dir, kw, message):
    with pytest.raises(InvalidInput, match=message):
        Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", **kw), SETTINGS)


def test_onnx_explicit_cpu_provider_list(minilm_onnx_dir):
    engine = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", providers=["CPUExecutionProvider"]),
                         SETTINGS)
    assert engine.describe()["providers"] == ["CPUExecutionProvider"]


def test_torch_int8_quantizes_attention_linears_only(minilm_dir):
    import torch

    engine = Engine.load(ModelSpec(path=minilm_dir, backend="torch", dtype="int8"), SETTINGS)
    modules = dict(engine.backend._model.named_modules())
    quantized = [n for n, m in modules.items() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert len(quantized) == 6 * 4 + 1  # q, k, v, attention output per layer, and the pooler
    assert isinstance(modules["encoder.layer.0.intermediate.dense"], torch.nn.Linear)
    assert engine.describe()["dtype"] == "int8"


def test_int8_keeps_the_same_feed_forward_layers_fp32_in_torch_and_onnx(minilm_onnx_dir):
    """One rule (``is_feed_forward``) for torch module names and the exported graph's node names: the
    accurate int8 graph keeps exactly the feed-forward MatMuls with weights in float, as torch's int8 does."""
    import onnx

    from core.backends.heads import is_feed_forward

    for name in ("encoder.layer.0.intermediate.dense", "encoder.layer.5.output.dense",
                 "/inner/encoder/layer.0/intermediate/dense/MatMul", "/encoder/layer.3/output/dense/MatMul"):
        assert is_feed_forward(name), name
    for name in ("encoder.layer.0.attention.output.dense", "encoder.layer.0.attention.self.query", "pooler.dense",
                 "/encoder/layer.0/attention/output/dense/MatMul", "/encoder/layer.0/attention/self/MatMul_1"):
        assert not is_feed_forward(name), name
    nodes = onnx.load(str(minilm_onnx_dir / "onnx" / "model_int8_accurate.onnx"), load_external_data=False).graph.node
    float_matmuls = [n.name for n in nodes if n.op_type == "MatMul" and "/attention/self/" not in n.name]
    assert len(float_matmuls) == 6 * 2 and all(is_feed_forward(n) for n in float_matmuls)  # intermediate + output
    assert sum(n.op_type == "MatMulInteger" for n in nodes) == 6 * 4  # q, k, v, attention output


def test_new_spec_fields_validate():
    assert ModelSpec(path=".", compile=True, providers=["CPUExecutionProvider"]).torch.compile is True
    with pytest.raises(ValueError):
        ModelSpec(path=".", providers="CPUExecutionProvider")


def _op_types(path) -> set[str]:
    import onnx

    return {node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node}


def test_cpu_fp32_graph_is_plain_and_the_fp16_graph_is_fused(minilm_onnx_dir, minilm_onnx_fp16_file):
    """The fp32 export stays plain (ORT's CPU provider runs it faster than the offline-fused graph here);
    the fp16 graph for the CUDA provider gets the fused Attention/LayerNorm kernels."""
    fused_ops = {"Attention", "SkipLayerNormalization", "EmbedLayerNormalization"}
    plain = _op_types(minilm_onnx_dir / "onnx" / "model.onnx")
    assert not plain & fused_ops and "MatMul" in plain and "Softmax" in plain
    assert fused_ops <= _op_types(minilm_onnx_fp16_file)
