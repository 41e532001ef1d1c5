#!/usr/bin/env python
"""Compile a model folder for AWS Neuron (Inferentia 2 / Trainium) as a set of static shape buckets.

    python scripts/compile_neuron.py MODEL_DIR OUT_DIR --batch-sizes 1,8,32 --sequence-lengths 128,256,512

Runs on a host with the Neuron SDK and ``pip install -e '.[neuron]'`` (optimum-neuron, neuronx-cc).
OUT_DIR gets the model files and ``neuron/`` (one compiled model per bucket + ``manifest.json``);
serve it with ``backend: neuron`` (or ``auto``). Each bucket compiles separately (minutes each):
keep the list short. ``--no-auto-cast`` keeps fp32 matmuls (slower, closest to the original).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    from core.convert.neuron import (DEFAULT_BATCH_SIZES, DEFAULT_SEQUENCE_LENGTHS, compile_buckets,
                                     neuron_compiler)
    from core.errors import TesseraError

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--batch-sizes", type=_ints, default=list(DEFAULT_BATCH_SIZES))
    p.add_argument("--sequence-lengths", type=_ints, default=list(DEFAULT_SEQUENCE_LENGTHS))
    p.add_argument("--auto-cast-type", default="bf16", help="bf16 | fp16 | tf32 (matmuls)")
    p.add_argument("--no-auto-cast", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        auto_cast = None if args.no_auto_cast else "matmul"
        manifest = compile_buckets(
            args.model, args.out, batch_sizes=args.batch_sizes, sequence_lengths=args.sequence_lengths,
            compile_bucket=neuron_compiler(auto_cast=auto_cast, auto_cast_type=args.auto_cast_type),
            dtype="fp32" if auto_cast is None else args.auto_cast_type,
        )
    except TesseraError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(manifest.entries)} buckets")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
