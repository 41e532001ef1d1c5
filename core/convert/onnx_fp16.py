"""fp32 ONNX graph → fp16 graph for the CUDA execution provider (``onnx/model_fp16.onnx``).

Inputs stay int64 and the output stays float32 (``keep_io_types``), so the backend and the tasks see the
same names and types as with the fp32 graph. ONNX Runtime's CPU provider lacks fp16 kernels for most
ops: the backend refuses ``dtype: float16`` without a GPU provider. Not run on a GPU here.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import require


def convert_fp16(src_file: Path, dst_file: Path) -> Path:
    onnx = require("onnx", "export")
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src_file))
    converted = convert_float_to_float16(model, keep_io_types=True)
    Path(dst_file).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(converted, str(dst_file))
    return Path(dst_file)
