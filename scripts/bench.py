#!/usr/bin/env python
"""Closed-loop benchmark of a Tessera server, beside the same model called in-process.

    # start a server on loopback with the given models, load it, print a table, stop it
    python scripts/bench.py --model PATH [--backend onnx] [--dtype float32] \
        --concurrency 1,16,64 --batch 1,32 --texts short,long,mixed --duration 20

    # compare backends and dtypes on one model in one run: scripts/bench_backends.py

    # load an already running server (any loopback URL) instead
    python scripts/bench.py --url http://127.0.0.1:8000 --served-name all-MiniLM-L6-v2 ...

Every response is verified (item count, dimension, finite values): a broken server posts no number.
Figures: embeddings/s, tokens/s, p50/p90/p99 latency, errors; the server's CPU seconds and peak RSS
when this script started it; and the in-process figures (Engine without HTTP/batcher, and the bare
runtime call on pre-tokenized input) so the server's overhead is visible. The parts live in the
``benchmarks`` package (load generator, ready-check, result rows, in-process cells).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from benchmarks.artifacts import ensure_ct2, ensure_onnx, token_counts_for
from benchmarks.inprocess import inprocess_cells
from benchmarks.load import http_cell
from benchmarks.results import print_table
from benchmarks.server import peak_rss_mb, start_server, stop_server, wait_ready
from benchmarks.texts import make_texts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="load this running server (loopback) instead of starting one")
    p.add_argument("--model", type=Path, help="model folder to serve (default: the embedded MiniLM)")
    p.add_argument("--backend", default="onnx")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--served-name", default="bench")
    p.add_argument("--api-key", default=None)
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--texts", default="short,long")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per cell")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--no-inprocess", action="store_true")
    p.add_argument("--encoding", choices=["base64", "float"], default="base64",
                   help="encoding_format asked for (the OpenAI SDK asks base64 by default)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()

    concurrencies = [int(x) for x in args.concurrency.split(",")]
    batches = [int(x) for x in args.batch.split(",")]
    kinds = args.texts.split(",")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    threads = args.threads or len(os.sched_getaffinity(0))

    model_path = args.model
    if model_path is None:
        from core.config import default_model_path

        model_path = default_model_path()
    if args.backend == "onnx" and args.url is None:
        model_path = ensure_onnx(model_path)
    if args.backend == "ct2" and args.url is None:
        model_path = ensure_ct2(model_path)
    spec = {"path": str(model_path), "name": args.served_name, "backend": args.backend, "dtype": args.dtype}

    proc = None
    url = args.url
    result: dict = {"machine": f"{os.cpu_count()} cpus", "spec": spec}
    if url is None:
        url = f"http://127.0.0.1:{args.port}"
        proc = start_server([spec], args.port, threads, {})
    try:
        result["start_to_ready_s"] = wait_ready(url, proc)
        import httpx

        # the first request of each shape right after /ready (warm-up's job: as fast as the steady state);
        # only for a server started here (one given by --url has served before)
        first_ms = {}
        with httpx.Client(headers=headers, timeout=120) as client:
            shapes = [(kind, batch) for kind in kinds for batch in batches] if proc is not None else []
            client.get(url + "/health")  # the connection is opened here: its set-up is not the server's first request
            for kind, batch in shapes:
                body = {"input": make_texts(kind, batch, seed=99), "model": args.served_name,
                        "encoding_format": args.encoding}
                started = time.perf_counter()
                client.post(url + "/v1/embeddings", json=body).raise_for_status()
                first_ms[(kind, batch)] = 1e3 * (time.perf_counter() - started)
        probe = httpx.post(url + "/v1/embeddings", json={"input": "probe", "model": args.served_name},
                           headers=headers, timeout=60).json()
        dim = len(probe["data"][0]["embedding"])
        cells = []
        for kind in kinds:
            texts = make_texts(kind, 2048)
            counts = token_counts_for(model_path, texts)
            for batch in batches:
                for conc in concurrencies:
                    cell = asyncio.run(http_cell(url, args.served_name, texts, kind, batch, conc, args.duration,
                                                 dim, headers, proc.pid if proc else None, token_counts=counts,
                                                 encoding=args.encoding))
                    cells.append(cell.row())
                    print(json.dumps(cells[-1]), flush=True)
        result["http"] = cells
        result["server_peak_rss_mb"] = peak_rss_mb(proc.pid if proc else None)
    finally:
        if proc is not None:
            stop_server(proc)
    print_table(result["http"], f"HTTP, closed loop ({args.duration:.0f} s per cell), {spec['backend']} {spec['dtype']}")
    print(f"\nstart → ready: {result['start_to_ready_s']:.1f} s; server peak RSS: {result['server_peak_rss_mb']} MB")
    steady = {(c["texts"], c["batch"]): c["p50 ms"] for c in result["http"] if c["conc"] == 1}
    result["first_request_ms"] = []
    for (kind, batch), ms in first_ms.items():
        if (kind, batch) in steady:
            ratio = ms / steady[(kind, batch)]
            result["first_request_ms"].append({"texts": kind, "batch": batch, "first ms": ms, "ratio": ratio})
            print(f"first request after /ready, {kind} × {batch}: {ms:.1f} ms = {ratio:.2f}× the steady p50 (1 client)")
    if not args.no_inprocess:
        result["inprocess"] = inprocess_cells(
            {k: v for k, v in spec.items() if k != "name"}, kinds, batches, min(args.duration, 10), threads)
        print_table(result["inprocess"], "In-process (same model, same inputs)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
