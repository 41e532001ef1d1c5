#!/usr/bin/env python
"""Convert a model folder for the CTranslate2 backend.

    python scripts/convert_ct2.py MODEL_DIR OUT_DIR [--quantization float16] [--trust-remote-code]

OUT_DIR gets the model's config/tokenizer/sentence-transformers files and ``ct2/`` (the converted
encoder); serve it with ``backend: ct2`` (or ``auto``) and ``dtype: float32 | int8 | int8_float32`` on CPU,
``float16 | bfloat16 | int8_float16`` on CUDA. OUT_DIR may be MODEL_DIR itself (adds ``ct2/`` beside the
weights). Supported: BERT, DistilBERT, RoBERTa, XLM-RoBERTa encoders.

A model with its own code (config.json ``auto_map``) is refused unless --trust-remote-code is given; then the
converted encoder is checked against the model as its own code computes it and kept only if it matches
(CTranslate2 runs the built-in class: a model whose code adds to it, e.g. task adapters, is refused).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main() -> int:
    from core.convert.ct2 import convert_folder
    from core.errors import TesseraError

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--quantization", default=None,
                   help="weight storage type (int8, float16, ...); default: keep float32 and pick at load")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="load the model's own code (config auto_map) as the reference the conversion must match")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        convert_folder(args.model, args.out, quantization=args.quantization,
                       trust_remote_code=args.trust_remote_code)
    except TesseraError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
