#!/usr/bin/env python
"""Convert a model folder for the CTranslate2 backend.

    python scripts/convert_ct2.py MODEL_DIR OUT_DIR [--quantization float16]

OUT_DIR gets the model's config/tokenizer/sentence-transformers files and ``ct2/`` (the converted
encoder); serve it with ``backend: ct2`` (or ``auto``) and ``dtype: float32 | int8 | int8_float32`` on CPU,
``float16 | bfloat16 | int8_float16`` on CUDA. OUT_DIR may be MODEL_DIR itself (adds ``ct2/`` beside the
weights). Supported: BERT, DistilBERT, RoBERTa, XLM-RoBERTa encoders.
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
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        convert_folder(args.model, args.out, quantization=args.quantization)
    except TesseraError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
