"""ONNX Runtime's optimized graph, written ahead of time (the Lambda image's build) so that a start-up
loads it with the graph optimizations off (spec ``ort_optimized: true``) instead of running them again.

    python -m core.convert.ort_optimized SRC.onnx DST.onnx

The graph is written at ``ORT_ENABLE_EXTENDED``: the fusions and constant folding ONNX Runtime's CPU
provider applies, without ``ORT_ENABLE_ALL``'s layout transformations, which ONNX Runtime marks as specific
to the machine that wrote them. Run it with the onnxruntime version (and on the platform) that will serve
it: the contrib operators it fuses into belong to that runtime. Parity with the plain graph under full
optimization is exact for the int8 graphs tested (tests/backends/test_ort_optimized.py). What it
saves is the optimization time only; where constant folding expands weights (a weight-only int8 graph
whose int8→float conversion is folded), the written graph is larger than its source: the command prints
both sizes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from core.errors import require


def write_optimized(src: Path, dst: Path) -> Path:
    """Write ONNX Runtime's ``ORT_ENABLE_EXTENDED`` graph of ``src`` to ``dst`` (may be ``src`` itself)."""
    ort = require("onnxruntime", "onnx")
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp)
    ort.InferenceSession(str(src), sess_options=opts, providers=["CPUExecutionProvider"])
    os.replace(tmp, dst)
    return dst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    args = parser.parse_args(argv)
    before = args.src.stat().st_size
    write_optimized(args.src, args.dst)
    print(f"wrote {args.dst}: {args.dst.stat().st_size / 1e6:.1f} MB (from {before / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
