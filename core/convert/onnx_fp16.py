"""fp32 ONNX graph → fp16 graph for the CUDA execution provider (``onnx/model_fp16.onnx``).

Given the model's ``config``, ONNX Runtime's transformer fusions (fused Attention, LayerNorm, GELU: the
kernels the CUDA provider runs fastest) are applied first; the CPU fp32 graph stays plain
(``core/convert/onnx_export.py`` says why; the fusions are ``core/convert/fusion.py``).

Inputs stay int64 and the output stays float32 (``keep_io_types``), so the backend and the tasks see the
same names and types as with the fp32 graph. Made for the CUDA provider (not run on a GPU here); ONNX
Runtime 1.32's CPU provider also runs it (no faster than fp32 on CPU), which is how the parity matrix
checks the conversion.
"""

from __future__ import annotations

from pathlib import Path

from core.convert.fusion import fused_graph
from core.errors import require


def convert_fp16(src_file: Path, dst_file: Path, *, config: dict | None = None) -> Path:
    """Write the fp16 graph of ``src_file`` to ``dst_file``; ``config`` (the folder's config.json): fuse first."""
    onnx = require("onnx", "export")
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = fused_graph(Path(src_file), config) if config is not None else None
    if model is None:
        model = onnx.load(str(src_file))
    converted = convert_float_to_float16(model, keep_io_types=True)
    Path(dst_file).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(converted, str(dst_file))
    return Path(dst_file)
