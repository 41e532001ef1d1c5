#!/usr/bin/env python
"""Export a model folder to an ONNX model folder.

    python scripts/export_onnx.py MODEL_DIR OUT_DIR [--int8 fast|accurate]... [--fp16] [--optimize] [--opset 17]
                                  [--trust-remote-code]

Writes OUT_DIR/onnx/model.onnx (fp32, the plain export: the fastest graph for ONNX Runtime's CPU
provider here), with --int8 OUT_DIR/onnx/model_int8[_accurate].onnx (dynamic int8 quantization), with
--fp16 OUT_DIR/onnx/model_fp16.onnx (transformer fusions, then fp16: for the CUDA provider), plus the
tokenizer/config files. --optimize also fuses the fp32 graph (for GPU fp32; slower on CPU here).

Prints one line per stage (export, each int8 variant, fusions, fp16), then checks every graph against
the torch forward on the export cache's probe texts (worst cosine; the fp32 graph must reach 0.9999,
the fp16 graph is checked on a GPU only), and ends with the files written, their sizes and the
TESSERA_MODELS entry that serves each. The exporters' own warnings are hidden (--verbose shows them).

A model with its own code (config.json ``auto_map``, e.g. jina-embeddings-v3) is exported with that code only
with --trust-remote-code, and checked against the model as that code computes it; without the flag it is
refused (transformers' built-in class of its model_type would give different vectors). The graphs that pass
are recorded in OUT_DIR/onnx/parity.json, which lets ``backend: auto`` serve them for such a model.
Needs the [export] extra (torch, transformers, onnx, onnxruntime).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

import numpy as np

from core.convert.onnx_export import export_folder, head_for_folder, load_head_model, model_config
from core.errors import TesseraError
from core.convert.export_cache import PARITY_MIN_COSINE, compare, graph_outputs, probe_inputs, torch_outputs
from core.loading import PARITY_RECORD, custom_code, task_adapters

#: graph file → the spec fields that serve it (backend onnx)
SERVED_BY = {"model.onnx": {}, "model_int8.onnx": {"dtype": "int8"},
             "model_int8_accurate.onnx": {"dtype": "int8", "onnx_file": "onnx/model_int8_accurate.onnx"},
             "model_fp16.onnx": {"dtype": "float16", "device": "cuda"}}


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
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run the model's own code (config auto_map) to export it and as the reference")
    parser.add_argument("--verbose", action="store_true", help="show the exporters' and quantizer's own messages")
    return parser.parse_args(argv)


def check(model_dir: Path, out_dir: Path, head: str, out=sys.stdout, *, trust_remote_code: bool = False) -> bool:
    """One line per graph: its worst cosine against the torch forward of the model as the spec loads it (its own
    code with ``trust_remote_code``); False when the fp32 graph misses. The graphs checked are recorded in
    ``onnx/parity.json`` (for a model with its own code, only graphs listed there are served under ``auto``)."""
    feeds = probe_inputs(model_dir, head)
    model = load_head_model(model_dir, head, trust_remote_code=trust_remote_code)
    # a model with task adapters (jina-embeddings-v3): every task, the graph's task_id against the model's code
    tasks = range(len(task_adapters(model_config(model_dir)))) or [None]
    variants = []
    for task in tasks:
        fed = dict(feeds) if task is None else {**feeds, "task_id": np.asarray(task, dtype=np.int64),
                                                "adapter_mask": np.full(len(feeds["input_ids"]), task, np.int64)}
        variants.append((fed, torch_outputs(model, head, fed)))
    ok, checked = True, {}
    for graph in sorted((out_dir / "onnx").glob("*.onnx")):
        if graph.name == "model_fp16.onnx":
            print(f"check {graph.name}: not run on CPU (fp16 is for the CUDA provider)", file=out)
            continue
        worst = min(min(compare(graph_outputs(graph, head, fed), want, fed["attention_mask"])[0].values())
                    for fed, want in variants)
        gate = graph.name == "model.onnx"
        verdict = ("ok" if worst >= PARITY_MIN_COSINE else "BELOW the 0.9999 parity gate") if gate else "int8"
        ok = ok and (not gate or worst >= PARITY_MIN_COSINE)
        if not gate or worst >= PARITY_MIN_COSINE:
            checked[graph.name] = round(worst, 7)
        print(f"check {graph.name}: worst cosine vs torch {worst:.6f} ({verdict})", file=out)
    record = {"own_code": custom_code(model_config(model_dir)), "model_class": type(model).__name__,
              "head": head, "checked": checked if ok else {}}
    (out_dir / "onnx" / PARITY_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return ok


def summary(out_dir: Path, out=sys.stdout, *, trust_remote_code: bool = False) -> None:
    print(f"wrote {out_dir}:", file=out)
    trust = {"trust_remote_code": True} if trust_remote_code and custom_code(model_config(out_dir)) else {}
    for graph in sorted((out_dir / "onnx").glob("*.onnx")):
        size = sum(f.stat().st_size for f in graph.parent.glob(graph.name + "*")) / 1e6  # with external data
        entry = {"path": str(out_dir), "backend": "onnx", **SERVED_BY.get(graph.name, {"onnx_file": f"onnx/{graph.name}"}),
                 **trust}
        print(f"  onnx/{graph.name}  {size:.1f} MB  TESSERA_MODELS='[{json.dumps(entry)}]'", file=out)


def main(argv: list[str] | None = None, out=sys.stdout) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(message)s")
    logging.getLogger("core").setLevel(logging.INFO)  # the stage lines (and the project's own warnings)
    if not args.verbose:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    try:
        head = args.head or head_for_folder(args.model_dir)
        with warnings.catch_warnings():
            if not args.verbose:
                warnings.simplefilter("ignore")
            export_folder(args.model_dir, args.out_dir, optimize=args.optimize, int8=tuple(args.int8),
                          fp16=args.fp16, opset=args.opset, head=head, trust_remote_code=args.trust_remote_code)
            ok = check(args.model_dir, args.out_dir, head, out, trust_remote_code=args.trust_remote_code)
    except TesseraError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    summary(args.out_dir, out, trust_remote_code=args.trust_remote_code)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
