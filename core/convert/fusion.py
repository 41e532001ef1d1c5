"""ONNX Runtime's offline transformer fusions (fused Attention, LayerNorm, GELU) of an exported graph: what
the CUDA provider runs best (``onnx_fp16.py`` fuses before converting); the CPU fp32 graph stays plain by
default (``onnx_export.py`` says why)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def fused_graph(path: Path, config: dict):
    """The graph at ``path`` with attention/LayerNorm/GELU fused by ONNX Runtime's transformer optimizer
    (an ``onnx.ModelProto``), or None for model types the optimizer does not know."""
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = config.get("model_type", "bert")
    known = {"bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet", "bart", "gpt2", "t5"}
    if model_type not in known:
        log.warning("no transformer fusions for model_type %r; keeping the plain graph", model_type)
        return None
    fused = optimize_model(
        str(path),
        model_type="bert" if model_type in ("xlm-roberta", "roberta", "electra", "mpnet") else model_type,
        num_heads=int(config.get("num_attention_heads", 0)),
        hidden_size=int(config.get("hidden_size", 0)),
        opt_level=1,
        use_gpu=False,
    )
    log.info("fusions: %s", fused.get_fused_operator_statistics())
    fused.topological_sort()  # what its save_model_to_file does before writing
    return fused.model


def optimize_transformer(path: Path, config: dict) -> bool:
    """Fuse in place (``fused_graph``). Returns False (graph left as exported) for unknown model types."""
    import onnx

    model = fused_graph(path, config)
    if model is None:
        return False
    onnx.save(model, str(path))
    return True
