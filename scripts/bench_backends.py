#!/usr/bin/env python
"""Compare backends and precisions on one model in one run (in-process; optionally over HTTP).

    python scripts/bench_backends.py [--model PATH] [--configs torch:float32,onnx:int8,ct2:int8,...] \
        [--texts short,long] [--batch 1,32] [--duration 3] [--threads 2] [--http --concurrency 16]

Each config is ``backend:dtype`` (``torch:float32+compile`` adds torch.compile). The model folder is
prepared once per backend under .venv/models/ (ONNX export with both int8 flavours, CTranslate2
conversion); ``onnx:int8-accurate`` picks the accurate int8 graph. Every config is also checked
against the torch float32 vectors on the benchmark texts (worst cosine), so a fast wrong config shows.
Built on the ``benchmarks`` package (texts, in-process cells, server, HTTP cells, tables).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from benchmarks.artifacts import ensure_ct2, ensure_onnx
from benchmarks.inprocess import inprocess_cells, load_engine
from benchmarks.load import http_cell
from benchmarks.parity import engine_worst_cosine
from benchmarks.results import print_table
from benchmarks.server import start_server, stop_server, wait_ready
from benchmarks.texts import make_texts

DEFAULT_CONFIGS = ("torch:float32,torch:bfloat16,torch:int8,onnx:float32,onnx:int8,onnx:int8-accurate,"
                   "ct2:float32,ct2:int8")


def spec_for(config: str, model_path: Path) -> dict:
    backend, _, dtype = config.partition(":")
    dtype = dtype or "float32"
    spec: dict = {"backend": backend}
    if dtype.endswith("+compile"):
        dtype, spec["compile"] = dtype[: -len("+compile")], True
    if backend == "onnx":
        folder = ensure_onnx(model_path)
        if dtype == "int8-accurate":
            dtype, spec["onnx_file"] = "int8", str(folder / "onnx" / "model_int8_accurate.onnx")
    elif backend == "ct2":
        folder = ensure_ct2(model_path)
    else:
        folder = model_path
    spec.update(path=str(folder), dtype=dtype)
    return spec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path)
    p.add_argument("--configs", default=DEFAULT_CONFIGS)
    p.add_argument("--texts", default="short,long")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per in-process cell")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--http", action="store_true", help="also load a real server per config (loopback)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--port", type=int, default=8766)
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    from core.config import default_model_path
    from core.tasks.embed import EmbedRequest

    model_path = args.model or default_model_path()
    threads = args.threads or len(os.sched_getaffinity(0))
    kinds, batches = args.texts.split(","), [int(b) for b in args.batch.split(",")]
    check_texts = make_texts("mixed", 64, seed=1)
    reference = load_engine(model_path, threads, backend="torch").run_sync(
        EmbedRequest(texts=check_texts, normalize=True)).vectors

    rows, http_rows = [], []
    for config in args.configs.split(","):
        spec = spec_for(config, model_path)
        started = time.perf_counter()
        cos = engine_worst_cosine(spec, reference, check_texts, threads)
        load_s = time.perf_counter() - started
        for row in inprocess_cells(spec, kinds, batches, args.duration, threads):
            if row["path"].startswith("engine"):
                rows.append({"config": config, "texts": row["texts"], "batch": row["batch"],
                             "emb/s": row["emb/s"], "p50 ms": row["p50 ms"], "worst cos vs torch fp32": f"{cos:.4f}",
                             "load+check s": load_s})
        print(json.dumps(rows[-1]), flush=True)
        if args.http:
            served = {**spec, "name": "bench"}
            proc = start_server([served], args.port, threads, {})
            try:
                wait_ready(f"http://127.0.0.1:{args.port}", proc)
                for kind in kinds:
                    texts = make_texts(kind, 2048)
                    for batch in batches:
                        cell = asyncio.run(http_cell(f"http://127.0.0.1:{args.port}", "bench", texts, kind,
                                                     batch, args.concurrency, args.duration, None, {},
                                                     proc.pid))
                        http_rows.append({"config": config, **cell.row()})
            finally:
                stop_server(proc)
    print_table(rows, f"In-process engine (tokenize+run+pool), {threads} threads, {args.duration:.0f} s per cell")
    if http_rows:
        print_table(http_rows, f"HTTP, closed loop, concurrency {args.concurrency}")
    if args.json:
        args.json.write_text(json.dumps({"inprocess": rows, "http": http_rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
