#!/usr/bin/env python
"""Export a model folder to an ONNX model folder.

    python scripts/export_onnx.py MODEL_DIR OUT_DIR [--int8 fast|accurate]... [--fp16] [--optimize] [--opset 17]

Writes OUT_DIR/onnx/model.onnx (fp32, the plain export: the fastest graph for ONNX Runtime's CPU
provider here), with --int8 OUT_DIR/onnx/model_int8[_accurate].onnx (dynamic int8 quantization), with
--fp16 OUT_DIR/onnx/model_fp16.onnx (transformer fusions, then fp16: for the CUDA provider), plus the
tokenizer/config files. --optimize also fuses the fp32 graph (for GPU fp32; slower on CPU here).
Serve with TESSERA_MODELS='[{"path": "OUT_DIR", "backend": "onnx"}]' (add "dtype": "int8").
Needs the [export] extra (torch, transformers, onnx, onnxruntime).
"""

import argparse
import logging
from pathlib import Path

from core.convert.onnx_export import export_folder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--int8", action="append", choices=["fast", "accurate"], default=[],
                        help="also write an int8 graph: fast (all MatMuls) → onnx/model_int8.onnx, "
                             "accurate (feed-forward kept fp32) → onnx/model_int8_accurate.onnx; repeatable")
    parser.add_argument("--fp16", action="store_true",
                        help="also write onnx/model_fp16.onnx (for the CUDA provider; dtype: float16)")
    parser.add_argument("--optimize", action="store_true",
                        help="fuse attention/LayerNorm/GELU in the fp32 graph too (GPU fp32; slower on CPU here)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--head", default=None,
                        help="model head to export (encoder, sequence-classification, splade, masked-lm, causal-lm); "
                             "default: the head of the folder's detected task")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = export_folder(args.model_dir, args.out_dir, optimize=args.optimize, int8=tuple(args.int8),
                        fp16=args.fp16, opset=args.opset, head=args.head)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
