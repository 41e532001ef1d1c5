"""Tessera beside Infinity on the tasks other than text embeddings (rerank, classify, CLIP), each server in
its default configuration with its best CPU engine, the same random-weight model folder and precision,
interleaved (plain loop, Tessera, Infinity, repeated), every answer verified.

- Tessera's spec names the folder and the name only (``backend: auto``); at int8 also ``dtype: int8``
  and the folder is the ``scripts/export_onnx.py`` export (``onnx/model_int8.onnx``).
- Infinity: ``--engine optimum`` for rerank and classify (the same plain export of the head, quantized
  the same way at int8); CLIP has only Infinity's torch engine. Its classifier starts with
  ``--no-model-warmup``: 0.0.78's optimum classifier pipeline does not truncate, so its own warm-up
  (512 words + 2 special tokens) fails on any 512-position BERT and the server exits.
- The plain loop (the runtime's own limit) runs in one process on all cores, interleaved with the
  servers: beside a one-client cell with the request's items per call (its mean time per call is the
  floor of a request's latency), beside a many-client cell with ``PLAIN_BATCH`` items per call (its
  rate is the ceiling of the throughput).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.artifacts import MODELS_DIR, ensure_onnx
from benchmarks.infinity import infinity_folder, start_infinity
from benchmarks.load import http_cell, verify
from benchmarks.server import peak_rss_mb, start_server, stop_server, wait_ready

TASKS = ("rerank", "classify", "clip")
#: kind:items per request:clients, per task (rerank: documents per request beside one query)
DEFAULT_CELLS = {
    "rerank": "docs:32:1,docs:32:64",
    "classify": "short:1:1,short:32:1,short:1:64,short:32:64",
    "clip": "image:1:1,image:8:1,image:1:64,text:1:1,text:32:1,text:1:64",
}
#: items per call of the plain loop (the servers' batch size)
PLAIN_BATCH = 32
CLIP_DIM = 512
#: where the Tessera servers of the comparison keep their exported graphs (TESSERA_CACHE_DIR)
EXPORT_CACHE = MODELS_DIR / "export-cache"


@dataclass(frozen=True)
class Workload:
    """What one cell sends: the pool of items, the route, the body for a chunk, the answer's check."""

    kind: str
    unit: str
    items: list
    route: str
    body_for: Callable[[list], dict]
    check: Callable[[int, bytes, int], bool]


def rerank_query() -> str:
    from benchmarks.texts import make_texts

    return make_texts("short", 1, seed=1)[0]


def workload(task: str, kind: str, labels: list[str] | None = None, model: str = "bench") -> Workload:
    from benchmarks.media import photo_uris
    from benchmarks.texts import make_texts

    if task == "rerank":
        query = rerank_query()
        return Workload(kind, "pairs", make_texts("short", 2048), "/rerank",
                        lambda docs: {"model": model, "query": query, "documents": docs}, check_rerank)
    if task == "classify":
        return Workload(kind, "texts", make_texts(kind, 2048), "/classify",
                        lambda texts: {"model": model, "input": texts},
                        lambda status, body, n: check_classify(status, body, n, labels))
    if task == "clip" and kind == "image":
        return Workload(kind, "images", photo_uris(64), "/embeddings",
                        lambda uris: {"model": model, "input": uris, "modality": "image",
                                      "encoding_format": "base64"},
                        lambda status, body, n: verify(status, body, n, CLIP_DIM))
    if task == "clip":  # the text tower on the short texts
        return Workload(kind, "texts", make_texts("short", 2048), "/embeddings",
                        lambda texts: {"model": model, "input": texts, "encoding_format": "base64"},
                        lambda status, body, n: verify(status, body, n, CLIP_DIM))
    raise SystemExit(f"unknown task {task!r}")


def check_rerank(status: int, body: bytes, count: int) -> bool:
    """A 200 with one result per document: every index once, finite scores, best first."""
    if status != 200:
        return False
    results = json.loads(body)["results"]
    scores = [r["relevance_score"] for r in results]
    return (len(results) == count and sorted(r["index"] for r in results) == list(range(count))
            and all(math.isfinite(s) for s in scores) and scores == sorted(scores, reverse=True))


def check_classify(status: int, body: bytes, count: int, labels: list[str] | None) -> bool:
    """A 200 with one entry per text, in order, each every label once with a finite score."""
    if status != 200:
        return False
    data = json.loads(body)["data"]
    return len(data) == count and all(
        (labels is None or sorted(d["label"] for d in entry) == sorted(labels))
        and all(math.isfinite(d["score"]) for d in entry) for entry in data)


# ---- the model folders and servers --------------------------------------------------------------------

@dataclass(frozen=True)
class Setup:
    tessera_spec: dict
    infinity_dir: Path
    infinity_engine: str
    infinity_extra: tuple[str, ...]
    plain_graph: Path | None
    tokenizer_json: Path
    labels: list[str] | None


def setup(task: str, precision: str) -> Setup:
    """Both servers' model folders for ``task`` at ``precision`` (built and exported once)."""
    from benchmarks.task_models import task_model_dir

    folder = task_model_dir(task)
    dtype = {"dtype": "int8"} if precision == "int8" else {}
    config = json.loads((folder / "config.json").read_text())
    labels = [config["id2label"][str(i)] for i in range(len(config["id2label"]))] if task == "classify" else None
    if task == "clip":  # torch in both servers: the torch folder itself
        return Setup({"path": str(folder), "name": "bench", **dtype}, folder, "torch", (), None,
                     folder / "tokenizer.json", None)
    # fp32: the torch folder (auto exports it into the export cache); int8: the export_onnx.py folder
    served = ensure_onnx(folder) if precision == "int8" else folder
    inf_dir = infinity_folder(folder, precision, head="sequence-classification")
    graph = inf_dir / ("model_quantized.onnx" if precision == "int8" else "model.onnx")
    extra = ("--no-model-warmup",) if task == "classify" else ()
    return Setup({"path": str(served), "name": "bench", **dtype}, inf_dir, "optimum", extra, graph,
                 folder / "tokenizer.json", labels)


def plain_call(task: str, kind: str, s: Setup, precision: str, threads: int) -> Callable[[list], object]:
    """The hand-written loop's call for one chunk of the workload's items."""
    if task == "clip":
        from benchmarks.plain_torch import plain_torch_clip

        images, texts = plain_torch_clip(Path(s.tessera_spec["path"]), threads, "int8" if precision == "int8" else "float32")
        return images if kind == "image" else texts
    from benchmarks.plain_ort import plain_ort_classifier, plain_ort_reranker

    if task == "rerank":
        rerank, query = plain_ort_reranker(s.plain_graph, s.tokenizer_json, threads), rerank_query()
        return lambda docs: rerank(query, docs)
    return plain_ort_classifier(s.plain_graph, s.tokenizer_json, threads)


def parse_cells(text: str) -> list[tuple[str, int, int]]:
    return [(k, int(b), int(c)) for k, b, c in (cell.split(":") for cell in text.split(","))]


def run_task(task: str, precision: str, infinity: str, cells: list[tuple[str, int, int]], duration: float,
             reps: int, plain: bool = True) -> dict:
    """Both servers up, every cell ``reps`` times interleaved; returns rows and the servers' figures."""
    from benchmarks.plain_ort import batches, timed_rate

    s = setup(task, precision)
    threads = len(os.sched_getaffinity(0))
    servers: dict[str, dict] = {}
    try:
        for name, port, start, health, timeout in (
            ("tessera", 8811, lambda port: start_server([s.tessera_spec], port, None,
                                                        {"TESSERA_CACHE_DIR": str(EXPORT_CACHE)}), "/ready", 600),
            ("infinity", 8812, lambda port: start_infinity(infinity, s.infinity_dir, port, precision,
                                                           s.infinity_engine, s.infinity_extra), "/health", 600),
        ):
            proc = start(port)
            url = f"http://127.0.0.1:{port}"
            servers[name] = {"proc": proc, "url": url, "start_s": wait_ready(url, proc, timeout, path=health)}
            print(f"{name}: healthy after {servers[name]['start_s']:.1f} s", flush=True)
        rows = []
        plain_calls: dict[str, Callable] = {}
        for kind, batch, conc in cells:
            w = workload(task, kind, s.labels)
            runs: dict[str, list] = {"tessera": [], "infinity": []}
            plain_rates: list[float] = []
            for _ in range(reps):
                if plain:
                    if kind not in plain_calls:
                        plain_calls[kind] = plain_call(task, kind, s, precision, threads)
                    per_call = batch if conc == 1 else PLAIN_BATCH
                    plain_rates.append(timed_rate(plain_calls[kind], batches(w.items, per_call), duration))
                for name in ("tessera", "infinity"):  # interleaved: A B A B
                    srv = servers[name]
                    cell = asyncio.run(http_cell(srv["url"], "bench", w.items, kind, batch, conc, duration, None, {},
                                                 srv["proc"].pid, route=w.route, body_for=w.body_for,
                                                 check=w.check))
                    runs[name].append(cell.row())
            row = summarize(task, w.unit, kind, batch, conc, runs, plain_rates)
            rows.append(row)
            print(json.dumps(row), flush=True)
        plain_calls.clear()
        for srv in servers.values():
            srv["peak_rss_mb"] = peak_rss_mb(srv["proc"].pid)
    finally:
        for srv in servers.values():
            stop_server(srv["proc"])
    return {"task": task, "precision": precision, "tessera_spec": s.tessera_spec,
            "infinity_engine": s.infinity_engine, "infinity_extra": list(s.infinity_extra), "duration_s": duration, "reps": reps, "plain_batch": PLAIN_BATCH,
            "rows": rows, "servers": {k: {"start_s": v["start_s"], "peak_rss_mb": v.get("peak_rss_mb")}
                                      for k, v in servers.items()}}


def summarize(task: str, unit: str, kind: str, batch: int, conc: int, runs: dict[str, list],
              plain_rates: list[float]) -> dict:
    """One row: per server the median rate, p50 and p99 over the repetitions; the Tessera/Infinity ratios
    of throughput and p50 (median, min–max of the paired repetitions); against the plain loop: one
    client, its mean ms per call of ``batch`` items and Tessera's p50 over it; many clients, its rate and
    Tessera's rate over it."""
    row: dict = {"task": task, "kind": kind, "batch": batch, "conc": conc, "unit": unit}
    for name, cells in runs.items():
        row[f"{name} items/s"] = statistics.median(c["emb/s"] for c in cells)
        row[f"{name} p50 ms"] = statistics.median(c["p50 ms"] for c in cells)
        row[f"{name} p99 ms"] = statistics.median(c["p99 ms"] for c in cells)
        row[f"{name} errors"] = sum(c["errors"] for c in cells)
    pairs = list(zip(runs["tessera"], runs["infinity"]))
    for key, field in (("throughput T/I", "emb/s"), ("p50 T/I", "p50 ms")):
        ratios = [t[field] / i[field] for t, i in pairs if i[field]]
        row[key] = statistics.median(ratios) if ratios else float("nan")
        row[f"{key} min-max"] = f"{min(ratios):.2f}–{max(ratios):.2f}" if ratios else ""
    if plain_rates and conc == 1:
        row["plain ms/call"] = 1000 * batch / statistics.median(plain_rates)
        vs = [t["p50 ms"] / (1000 * batch / p) for t, p in zip(runs["tessera"], plain_rates)]
        row["tessera p50/plain"] = statistics.median(vs)
        row["tessera p50/plain min-max"] = f"{min(vs):.2f}–{max(vs):.2f}"
    elif plain_rates:
        row["plain items/s"] = statistics.median(plain_rates)
        vs = [t["emb/s"] / p for t, p in zip(runs["tessera"], plain_rates)]
        row["tessera/plain"] = statistics.median(vs)
        row["tessera/plain min-max"] = f"{min(vs):.2f}–{max(vs):.2f}"
    return row


def markdown(result: dict) -> str:
    """The run's table (Markdown)."""
    lines = ["| cell | Tessera /s | Infinity /s | throughput T/I (min–max) | Tessera p50 / p99 ms | "
             "Infinity p50 / p99 ms | p50 T/I (min–max) | plain loop | Tessera vs plain (min–max) | errors T/I |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "plain items/s" in r:
            plain = f"{r['plain items/s']:.1f} /s | {r['tessera/plain']:.2f}× rate ({r['tessera/plain min-max']})"
        elif "plain ms/call" in r:
            plain = (f"{r['plain ms/call']:.1f} ms/call | {r['tessera p50/plain']:.2f}× time "
                     f"({r['tessera p50/plain min-max']})")
        else:
            plain = "– | –"
        lines.append(
            f"| {r['kind']} ×{r['batch']}, {r['conc']} client{'s' if r['conc'] > 1 else ''} ({r['unit']}) | "
            f"{r['tessera items/s']:.1f} | {r['infinity items/s']:.1f} | "
            f"{r['throughput T/I']:.2f} ({r['throughput T/I min-max']}) | "
            f"{r['tessera p50 ms']:.1f} / {r['tessera p99 ms']:.1f} | {r['infinity p50 ms']:.1f} / {r['infinity p99 ms']:.1f} | "
            f"{r['p50 T/I']:.2f} ({r['p50 T/I min-max']}) | {plain} | {r['tessera errors']}/{r['infinity errors']} |")
    return "\n".join(lines)
