"""Host CPU per embedding: what a server's whole process tree spends per embedding it answers, beside its
throughput, for a near-free model (where all that is left is the serving layer) and the default model,
Tessera and Infinity interleaved in one run on loopback (``scripts/bench_host_cpu.py`` is its command line).

- ``tree_cpu``: user + system CPU seconds of a process and all its descendants, from ``/proc``; children
  that have exited count through their parent's ``cutime``/``cstime`` (the kernel adds a reaped child's
  time, and its reaped descendants', there)
- ``near_free_model``: a 1-layer, hidden-32 BERT with all-MiniLM-L6-v2's tokenizer and mean pooling,
  built once from a config under ``.venv/models/``
- ``model_folder``: the one folder both servers load (the model's files and its plain fp32 ONNX graph)
- ``measure``: one closed-loop cell run by a load generator in its own process, the server tree's CPU
  read at the window's start and end; ``batch_counts``: a Tessera server's batches from its ``/metrics``, read
  around each of its cells (how large the batches it formed were); ``run``: the whole interleaved run; ``tokenizer_floor``,
  ``response_floor``: what tokenizing a text and encoding an answer cost at least
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.artifacts import MODELS_DIR

#: the near-free model's shape: one layer, hidden 32 (MiniLM's vocabulary and positions, so its tokenizer fits)
NEAR_FREE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
NEAR_FREE_NAME = "nearfree-bert-l1-h32"
#: the files that make a sentence-transformers folder (mean pooling) besides the weights and the tokenizer
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
MODELS = ("near-free", "minilm")
#: tessera: this checkout; infinity; bare: the bare ASGI app (``benchmarks.bare_asgi``, the stack's floor);
#: baseline: another checkout of Tessera (the commit before a change)
SERVERS = ("tessera", "infinity", "bare", "baseline")
#: ``tessera-fN``: this checkout as ``python -m core serve --frontends N`` (``--frontends`` of the script)
FRONTENDS_SERVER = re.compile(r"^tessera-f([1-9][0-9]*)$")


def known_server(name: str) -> bool:
    return name in SERVERS or FRONTENDS_SERVER.match(name) is not None


# ---- a process tree's CPU (Linux /proc) ----------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its live descendants (parents before children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    order, queue = [], [pid]
    while queue:
        p = queue.pop(0)
        order.append(p)
        queue.extend(sorted(children.get(p, ())))
    return order


def tree_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds so far of process ``pid``, its live descendants, and every descendant that
    has exited and been waited for (``cutime``/``cstime``); None when ``pid`` is gone. A child that exits
    between the reads of its parent and its own is missed once (a few ms at a window's edge)."""
    if pid is None or _stat(pid) is None:
        return None
    ticks = 0
    for p in tree_pids(pid):
        fields = _stat(p)
        if fields is not None:
            ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


# ---- the model folders ---------------------------------------------------------------------------------

def near_free_model(tokenizer_dir: Path | None = None, out: Path | None = None) -> Path:
    """The near-free model's folder (random weights, seed 0), built once: ``BertModel`` of ``NEAR_FREE``'s
    shape saved with ``save_pretrained``, all-MiniLM-L6-v2's tokenizer and its mean pooling (the pooling
    config says dimension 32). Written beside and renamed into place, so two builds at once do not clash."""
    from benchmarks.task_models import MINILM_L6, TOKENIZER_FILES

    out = out or MODELS_DIR / NEAR_FREE_NAME
    if (out / ".complete").exists():
        return out
    if tokenizer_dir is None:
        from core.config import default_model_path

        tokenizer_dir = default_model_path()
    import torch
    from transformers import BertConfig, BertModel

    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(0)
    config = BertConfig(**{**MINILM_L6, **NEAR_FREE})
    BertModel(config).eval().save_pretrained(tmp)
    for name in (*TOKENIZER_FILES, *ST_FILES):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    pooling = json.loads((tokenizer_dir / "1_Pooling" / "config.json").read_text())
    (tmp / "1_Pooling").mkdir()
    (tmp / "1_Pooling" / "config.json").write_text(
        json.dumps({**pooling, "word_embedding_dimension": config.hidden_size}, indent=2))
    (tmp / ".complete").write_text("ok")
    try:
        tmp.rename(out)
    except OSError:  # built meanwhile by another process
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def model_folder(model: str) -> Path:
    """The folder both servers load for ``model`` (``near-free`` or ``minilm``): the model's files with its
    plain fp32 ONNX graph at the root (``benchmarks.infinity.infinity_folder``; Tessera loads the same
    ``model.onnx``)."""
    from benchmarks.infinity import infinity_folder

    if model == "near-free":
        source = near_free_model()
    elif model == "minilm":
        from core.config import default_model_path

        source = default_model_path()
    else:
        raise SystemExit(f"unknown model {model!r} (one of {', '.join(MODELS)})")
    return infinity_folder(source, "fp32")


def dimension(folder: Path) -> int:
    return json.loads((folder / "config.json").read_text())["hidden_size"]


# ---- floors: what tokenizing a text and encoding an answer cost at least -------------------------------

def _cpu_rate(step, seconds: float) -> tuple[float, int]:
    """CPU seconds (this process, all threads) and calls of ``step`` run for ``seconds`` of wall time."""
    step()
    calls, cpu0, stop = 0, time.process_time(), time.perf_counter() + seconds
    while time.perf_counter() < stop or calls == 0:
        step()
        calls += 1
    return time.process_time() - cpu0, calls


def tokenizer_floor(folder: Path, texts: list[str], batch: int, seconds: float) -> float:
    """CPU µs per text of Tessera's tokenizer (the model's ``tokenizer.json``, truncating) on ``texts`` in
    calls of ``batch``."""
    from core.loading import read_model_info
    from core.tokenization import TextTokenizer

    tok = TextTokenizer(folder, read_model_info(folder).max_length)
    chunks = [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    state = {"i": 0}

    def step():
        tok.encode(chunks[state["i"] % len(chunks)])
        state["i"] += 1

    cpu, calls = _cpu_rate(step, seconds)
    return 1e6 * cpu / (calls * batch)


def response_floor(batch: int, dim: int, seconds: float) -> float:
    """CPU µs per embedding of writing an OpenAI embeddings answer of ``batch`` base64 float32 vectors of
    ``dim`` with orjson (the bytes a server sends, nothing else)."""
    import base64

    import numpy as np
    import orjson

    vectors = np.random.default_rng(0).standard_normal((batch, dim)).astype("<f4")

    def step():
        data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(v.tobytes()).decode()}
                for i, v in enumerate(vectors)]
        orjson.dumps({"object": "list", "data": data, "model": "bench",
                      "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    cpu, calls = _cpu_rate(step, seconds)
    return 1e6 * cpu / (calls * batch)


# ---- one cell: the load in its own process, the server tree's CPU over the window -----------------------

def _client_cell(url: str, texts: list[str], kind: str, batch: int, concurrency: int, duration: float,
                 dim: int, pid: int | None, route: str):
    import asyncio

    from benchmarks.load import http_cell

    return asyncio.run(http_cell(url, "bench", texts, kind, batch, concurrency, duration, dim, {}, pid,
                                 route=route, cpu=tree_cpu))


def client_pool(processes: int = 1) -> ProcessPoolExecutor:
    """The load generator's processes (spawned: none of them is the server's or this script's process, so
    the CPU they spend is never counted as the server's)."""
    import multiprocessing

    from benchmarks.load import warm_client

    pool = ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(warm_client, range(processes)))
    return pool


def measure(pool: ProcessPoolExecutor, processes: int, url: str, pid: int, texts: list[str], kind: str,
            batch: int, concurrency: int, duration: float, dim: int, route: str = "/embeddings") -> dict:
    """One closed-loop cell (``concurrency`` clients split over ``processes`` of ``pool``): every answer
    verified; the server's whole process tree's CPU over the window (read by the first client process
    at its window's start and end) against the embeddings answered in it."""
    from benchmarks.results import Cell

    procs = max(1, min(processes, concurrency))
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    futures = [pool.submit(_client_cell, url, texts, kind, batch, share, duration, dim, pid if i == 0 else None,
                           route) for i, share in enumerate(shares)]
    cell = Cell.combine([f.result(timeout=duration + 600) for f in futures])
    row = cell.row()
    cpu = cell.cpu_seconds
    return {
        "batch": batch, "conc": concurrency, "seconds": cell.seconds, "requests": row["requests"],
        "embeddings": cell.items, "errors": cell.errors,
        "server cpu s": cpu,
        "us/emb": 1e6 * cpu / cell.items if cpu is not None and cell.items else None,
        "us/req": 1e6 * cpu / row["requests"] if cpu is not None and row["requests"] else None,
        "emb/s": row["emb/s"], "cores": cpu / cell.seconds if cpu is not None and cell.seconds else None,
        "p50 ms": row["p50 ms"],
        "loadgen cores": (cell.client_cpu_seconds / cell.seconds
                          if cell.client_cpu_seconds is not None and cell.seconds else None),
    }


#: a Tessera server's batch counters in its /metrics (every model's series summed)
BATCH_COUNTERS = {"tessera_batch_size_count": "batches", "tessera_batch_size_sum": "items",
                  "tessera_batch_padded_tokens_sum": "padded tokens"}


def batch_counts(url: str) -> dict[str, float] | None:
    """The batches a Tessera server has run so far, the items in them and their padded tokens, from its
    ``/metrics`` (None where it answers none: another server, or a layout whose batches are counted elsewhere)."""
    import urllib.error
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    counts = dict.fromkeys(BATCH_COUNTERS.values(), 0.0)
    seen = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = BATCH_COUNTERS.get(sample.name)
            if key is not None:
                counts[key] += sample.value
                seen = True
    return counts if seen else None


def batch_shape(before: dict | None, after: dict | None) -> dict:
    """What a cell's batches were: how many, their items and padded tokens on average (None where unknown)."""
    batches = after["batches"] - before["batches"] if before and after else 0
    if not batches:
        return {"batches": None, "items/batch": None, "padded/batch": None}
    return {"batches": int(batches), "items/batch": (after["items"] - before["items"]) / batches,
            "padded/batch": (after["padded tokens"] - before["padded tokens"]) / batches}


# ---- the whole run ---------------------------------------------------------------------------------------

def start(server: str, folder: Path, port: int, infinity_bin: str | None, tessera_env: dict | None = None,
          output=None, tessera_options: dict | None = None, baseline: Path | None = None,
          baseline_options: dict | None = None):
    """``server`` serving ``folder`` as "bench" on 127.0.0.1:``port``; returns the process and its health
    path. ``tessera``: this checkout on ONNX Runtime fp32, otherwise its defaults, ``tessera_env`` and the
    model-spec options ``tessera_options``, its log lines to ``output``; ``baseline``: the same from the
    checkout ``baseline`` (the commit before a change), with ``baseline_options`` instead when given (an A/B of
    a setting: ``baseline`` may be this checkout); ``infinity``: its optimum engine, fp32, warnings
    only; ``bare``: the bare ASGI app answering with vectors of the model's dimension."""
    if server in ("tessera", "baseline") or FRONTENDS_SERVER.match(server):
        from benchmarks import ROOT
        from benchmarks.server import start_server

        if server == "baseline" and baseline is None:
            raise SystemExit("the baseline server needs the folder of a checkout to serve from")
        options = baseline_options if server == "baseline" and baseline_options is not None else tessera_options
        spec = {"path": str(folder), "name": "bench", "backend": "onnx", "dtype": "float32", **(options or {})}
        root = baseline if server == "baseline" else ROOT
        match = FRONTENDS_SERVER.match(server)
        return start_server([spec], port, None, dict(tessera_env or {}), output=output, root=root,
                            frontends=int(match.group(1)) if match else None), "/ready"
    if server == "bare":
        from benchmarks.bare_asgi import start_bare

        return start_bare(dimension(folder), port), "/health"
    if server != "infinity":
        raise SystemExit(f"unknown server {server!r} (one of {', '.join(SERVERS)})")
    from benchmarks.infinity import start_infinity

    return start_infinity(infinity_bin, folder, port, "fp32"), "/health"


def run(models: list[str], servers: list[str], batches: list[int], concurrency: int, duration: float,
        rounds: int, infinity_bin: str | None = None, clients: int = 1, floor_seconds: float = 1.0,
        tessera_env: dict | None = None, tessera_options: dict | None = None, log_dir: Path | None = None,
        baseline: Path | None = None, log=print, baseline_options: dict | None = None,
        kind: str = "short") -> dict:
    """Per model: every server started on loopback, then ``rounds`` rounds, each a cell per batch size per
    server in turn (A B A B …), texts of ``kind`` (benchmarks/texts.py: short, long, mixed); then the floors.
    Tessera's log lines go to ``log_dir/<model>-<server>.log`` (a new temporary folder by default);
    ``baseline``: the checkout the ``baseline`` server runs. Returns every cell and the medians."""
    import tempfile

    from benchmarks.loopback import free_port
    from benchmarks.server import peak_rss_mb, stop_server, wait_ready
    from benchmarks.texts import make_texts

    texts = make_texts(kind, 2048)
    result: dict = {"cpus": len(os.sched_getaffinity(0)), "loadavg_before": os.getloadavg(),
                    "config": {"models": models, "servers": servers, "batches": batches, "concurrency": concurrency,
                               "duration": duration, "rounds": rounds, "texts": kind, "client_processes": clients,
                               "tessera_env": dict(tessera_env or {}), "tessera_options": dict(tessera_options or {}),
                               "baseline_options": baseline_options,
                               "baseline": str(baseline) if baseline else None},
                    "cells": [], "servers": {}, "floors": []}
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="bench-host-cpu-"))
    result["log_dir"] = str(log_dir)
    pool = client_pool(clients)
    try:
        for model in models:
            folder = model_folder(model)
            dim = dimension(folder)
            running: dict = {}
            try:
                for server in servers:
                    port = free_port()
                    tessera = server in ("tessera", "baseline") or FRONTENDS_SERVER.match(server) is not None
                    output = open(log_dir / f"{model}-{server}.log", "w") if tessera else None
                    proc, health = start(server, folder, port, infinity_bin, tessera_env, output, tessera_options,
                                         baseline, baseline_options)
                    url = f"http://127.0.0.1:{port}"
                    running[server] = {"proc": proc, "url": url, "output": output, "tessera": tessera}
                    ready = wait_ready(url, proc, 300, path=health)
                    log(f"{model}: {server} ready after {ready:.1f} s (pid {proc.pid})")
                    result["servers"][f"{model}/{server}"] = {"start_s": ready}
                for r in range(1, rounds + 1):
                    for batch in batches:
                        for server in servers:
                            s = running[server]
                            load0 = os.getloadavg()[0]
                            others = {o: tree_cpu(running[o]["proc"].pid) for o in running if o != server}
                            batches0 = batch_counts(s["url"]) if s["tessera"] else None
                            cell = measure(pool, clients, s["url"], s["proc"].pid, texts, kind, batch,
                                           concurrency, duration, dim)
                            batches1 = batch_counts(s["url"]) if batches0 is not None else None
                            after = {o: tree_cpu(running[o]["proc"].pid) for o in others}
                            idle = sum(after[o] - cpu for o, cpu in others.items()
                                       if cpu is not None and after[o] is not None)
                            cell = {"model": model, "server": server, "round": r, **cell, "load1": load0,
                                    "server procs": len(tree_pids(s["proc"].pid)),
                                    "idle servers cores": idle / cell["seconds"] if cell["seconds"] else None,
                                    **batch_shape(batches0, batches1)}
                            result["cells"].append(cell)
                            log(cell_line(cell))
                for server, s in running.items():
                    result["servers"][f"{model}/{server}"]["peak_rss_mb"] = peak_rss_mb(s["proc"].pid)
            finally:
                for s in running.values():
                    stop_server(s["proc"])
                    if s["output"] is not None:
                        s["output"].close()
            for batch in batches:  # the servers are stopped: the floors run alone
                result["floors"].append({
                    "model": model, "batch": batch,
                    "tokenizer us/text": tokenizer_floor(folder, texts, batch, floor_seconds),
                    "response us/emb": response_floor(batch, dim, floor_seconds),
                })
    finally:
        pool.shutdown()
    result["loadavg_after"] = os.getloadavg()
    result["medians"] = medians(result["cells"])
    return result


FIGURES = ("us/emb", "us/req", "emb/s", "cores", "loadgen cores", "idle servers cores", "p50 ms", "load1",
           "items/batch")


def medians(cells: list[dict]) -> list[dict]:
    """Per model, batch and server: the median of each figure over the rounds, the counts summed."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["batch"], c["server"]), []).append(c)
    rows = []
    for (model, batch, server), group in groups.items():
        row = {"model": model, "batch": batch, "server": server, "rounds": len(group)}
        for key in FIGURES:
            values = [c[key] for c in group if c[key] is not None]
            row[key] = statistics.median(values) if values else None
        row["requests"] = sum(c["requests"] for c in group)
        row["embeddings"] = sum(c["embeddings"] for c in group)
        row["errors"] = sum(c["errors"] for c in group)
        rows.append(row)
    return rows


def cell_line(c: dict) -> str:
    def f(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    return (f"round {c['round']} {c['model']:>9} {c['server']:>8} {c['batch']:>2} texts/req: "
            f"{f(c['us/emb'], '.0f')} µs/emb, {f(c['us/req'], '.0f')} µs/req, {f(c['emb/s'], '.0f')} emb/s, "
            f"{f(c['cores'], '.2f')} cores busy in {c['server procs']} process(es) (load generator "
            f"{f(c['loadgen cores'], '.2f')}, idle servers {f(c['idle servers cores'], '.2f')}), "
            f"{c['requests']} req, {c['embeddings']} emb, {c['errors']} errors, load {c['load1']:.1f}"
            + (f", {c['items/batch']:.1f} items a batch" if c["items/batch"] is not None else ""))


def markdown(result: dict) -> str:
    """The medians, the ratios Tessera / Infinity, and the floors as Markdown tables."""
    lines = ["| model | texts/req | server | µs CPU per embedding | µs CPU per request | emb/s | cores busy "
             "| load generator cores (not counted) | idle servers cores | p50 ms | requests | embeddings | errors "
             "| load 1 min | items per batch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt):
        return "" if v is None else format(v, fmt)

    for r in result["medians"]:
        lines.append(f"| {r['model']} | {r['batch']} | {r['server']} | {f(r['us/emb'], '.0f')} | "
                     f"{f(r['us/req'], '.0f')} | {f(r['emb/s'], '.0f')} | {f(r['cores'], '.2f')} | "
                     f"{f(r['loadgen cores'], '.2f')} | {f(r['idle servers cores'], '.2f')} | "
                     f"{f(r['p50 ms'], '.1f')} | {r['requests']} | {r['embeddings']} | {r['errors']} | "
                     f"{f(r['load1'], '.1f')} | {f(r['items/batch'], '.1f')} |")
    by = {(r["model"], r["batch"], r["server"]): r for r in result["medians"]}
    ratios = []
    for other, label in (("infinity", "Infinity"), ("baseline", "the baseline"), ("bare", "the bare ASGI app")):
        for (model, batch, server) in by:
            if server != "tessera" or (model, batch, other) not in by:
                continue
            per = [(t["us/emb"] / o["us/emb"], t["emb/s"] / o["emb/s"])
                   for t, o in zip(_rounds(result, model, batch, "tessera"), _rounds(result, model, batch, other))
                   if t["us/emb"] and o["us/emb"] and o["emb/s"]]
            if per:
                ratios.append(f"| Tessera ÷ {label} | {model} | {batch} | {statistics.median(p[0] for p in per):.2f} "
                              f"| {statistics.median(p[1] for p in per):.2f} | {len(per)} |")
    for (model, batch, server) in by:  # tessera-fN ÷ tessera-f1: what N front ends change, same run
        match = FRONTENDS_SERVER.match(server)
        if match and match.group(1) != "1" and (model, batch, "tessera-f1") in by:
            per = [(t["us/emb"] / o["us/emb"], t["emb/s"] / o["emb/s"])
                   for t, o in zip(_rounds(result, model, batch, server), _rounds(result, model, batch, "tessera-f1"))
                   if t["us/emb"] and o["us/emb"] and o["emb/s"]]
            if per:
                ratios.append(f"| {match.group(1)} front ends ÷ 1 | {model} | {batch} | "
                              f"{statistics.median(p[0] for p in per):.2f} | "
                              f"{statistics.median(p[1] for p in per):.2f} | {len(per)} |")
    if ratios:
        lines += ["", "| ratio (median of the rounds' ratios) | model | texts/req | CPU per embedding | emb/s "
                      "| rounds |", "|---|---|---|---|---|---|", *ratios]
    if result["floors"]:
        lines += ["", "| model | texts per call | floor: tokenizer µs CPU per text | floor: base64 + JSON answer "
                      "µs CPU per embedding |", "|---|---|---|---|"]
        lines += [f"| {fl['model']} | {fl['batch']} | {fl['tokenizer us/text']:.1f} | {fl['response us/emb']:.1f} |"
                  for fl in result["floors"]]
    return "\n".join(lines)


def _rounds(result: dict, model: str, batch: int, server: str) -> list[dict]:
    return [c for c in result["cells"] if (c["model"], c["batch"], c["server"]) == (model, batch, server)]
