#!/usr/bin/env python
"""Closed-loop benchmark of a Tessera server, beside the same model called in-process.

    # start a server on loopback with the given models, load it, print a table, stop it
    python scripts/bench.py --model PATH [--backend onnx] [--dtype float32] \
        --concurrency 1,16,64 --batch 1,32 --texts short,long,mixed --duration 20

    # compare backends and dtypes on one model in one run: scripts/bench_backends.py (reuses this file)

    # load an already running server (any loopback URL) instead
    python scripts/bench.py --url http://127.0.0.1:8000 --served-name all-MiniLM-L6-v2 ...

Every response is verified (item count, dimension, finite values): a broken server posts no number.
Figures: embeddings/s, tokens/s, p50/p90/p99 latency, errors; the server's CPU seconds and peak RSS
when this script started it; and the in-process figures (Engine without HTTP/batcher, and the bare
runtime call on pre-tokenized input) so the server's overhead is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no what up out who them some "
    "could more into time only new about than other then these two may first any like now my such make over "
    "system model vector search query document latency throughput batch token server engine embedding"
).split()


def make_texts(kind: str, n: int, seed: int = 0) -> list[str]:
    """Deterministic texts: short ≈ 13 tokens, long ≈ 130 tokens, mixed: 4–250 tokens (log-uniform)."""
    rng = random.Random(f"{kind}-{seed}")
    if kind == "short":
        lengths = [10] * n
    elif kind == "long":
        lengths = [125] * n
    elif kind == "mixed":
        lengths = [int(round(2 ** rng.uniform(2, 7.9))) for _ in range(n)]
    else:
        raise SystemExit(f"unknown text kind {kind!r}")
    return [" ".join(rng.choice(WORDS) for _ in range(k)) for k in lengths]


@dataclass
class Cell:
    texts: str
    batch: int
    concurrency: int
    items: int = 0
    tokens: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu_seconds: float | None = None

    def row(self) -> dict:
        lat = sorted(self.latencies)

        def pct(p):
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

        return {
            "texts": self.texts, "batch": self.batch, "conc": self.concurrency,
            "emb/s": self.items / self.seconds if self.seconds else 0.0,
            "tok/s": self.tokens / self.seconds if self.seconds else 0.0,
            "p50 ms": pct(0.50), "p90 ms": pct(0.90), "p99 ms": pct(0.99),
            "errors": self.errors, "requests": len(lat),
            "server cpu %": (100 * self.cpu_seconds / self.seconds) if self.cpu_seconds is not None else None,
            # CPU the server spent per request (all its threads): compare with the in-process "cpu ms/batch"
            "server cpu ms/req": (1000 * self.cpu_seconds / len(lat)) if self.cpu_seconds is not None and lat else None,
        }


# ---- HTTP load ------------------------------------------------------------------------------------

async def http_cell(url: str, model: str | None, texts: list[str], kind: str, batch: int, concurrency: int,
                    duration: float, dim: int | None, headers: dict, pid: int | None,
                    route: str = "/v1/embeddings", token_counts: dict[str, int] | None = None,
                    encoding: str = "base64") -> Cell:
    """Closed loop: ``concurrency`` workers, each sending its next request when the last one is answered.
    aiohttp keeps the load generator cheap (it shares the CPU with the server on a small machine)."""
    import aiohttp

    cell = Cell(kind, batch, concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(base_url=url, connector=connector, timeout=timeout, headers=headers) as client:
        async def post(chunk):
            async with client.post(route, json={"input": chunk, "model": model, "encoding_format": encoding}) as r:
                return r.status, await r.read()

        # warm-up: open every connection with a one-text request (a full-batch warm-up of many slow
        # requests would leave early connections idle past the server's keep-alive timeout)
        await asyncio.gather(*(post(texts[:1]) for _ in range(concurrency)))
        stop_at = time.perf_counter() + duration
        cpu0 = process_cpu(pid)
        start = time.perf_counter()

        async def worker(w: int):
            i = w * 7919
            while time.perf_counter() < stop_at:
                chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
                i += batch
                t = time.perf_counter()
                status, body = await post(chunk)
                elapsed = time.perf_counter() - t
                if not verify(status, body, len(chunk), dim):
                    cell.errors += 1
                    continue
                cell.latencies.append(elapsed)
                cell.items += len(chunk)
                cell.tokens += sum(token_counts[t] for t in chunk) if token_counts else 0

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        cell.seconds = time.perf_counter() - start
        cpu1 = process_cpu(pid)
        if cpu0 is not None and cpu1 is not None:
            cell.cpu_seconds = cpu1 - cpu0
    return cell


def verify(status: int, body: bytes, count: int, dim: int | None) -> bool:
    """A 200 with ``count`` embeddings in order, of the expected dimension, all finite (float lists or
    base64 little-endian float32, as the OpenAI SDK asks by default)."""
    import base64

    import numpy as np

    if status != 200:
        return False
    data = json.loads(body)["data"]
    if len(data) != count or [d["index"] for d in data] != list(range(count)):
        return False
    for d in data:
        emb = d["embedding"]
        vec = np.frombuffer(base64.b64decode(emb), dtype="<f4") if isinstance(emb, str) else np.asarray(emb)
        if (dim is not None and vec.shape != (dim,)) or not np.isfinite(vec).all():
            return False
    return True


def token_counts_for(model_path: Path, texts: list[str]) -> dict[str, int]:
    """Tokens per text with the model's tokenizer (client-side, so servers that count otherwise compare)."""
    from core.loading import read_model_info
    from core.tokenization import TextTokenizer

    info = read_model_info(model_path)
    tok = TextTokenizer(model_path, info.max_length)
    return {t: e.cost for t, e in zip(texts, tok.encode(texts))}


def process_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def peak_rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


# ---- in-process references ------------------------------------------------------------------------

def inprocess_cells(spec_kwargs: dict, kinds: list[str], batches: list[int], duration: float,
                    threads: int) -> list[dict]:
    """The same model through ``Engine.run_sync`` (tokenize + run + pool, no HTTP, no batcher), and the
    bare backend call on pre-tokenized, pre-padded input (the runtime's own limit)."""
    from core.config import ModelSpec, Settings
    from core.engine import Engine
    from core.tasks.embed import EmbedRequest

    engine = Engine.load(ModelSpec(**spec_kwargs), Settings(threads=threads))
    rows = []
    for kind in kinds:
        texts = make_texts(kind, 512)
        for batch in batches:
            chunks = [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]
            for label, fn in (("engine (tokenize+run+pool)", None), ("bare runtime call", "bare")):
                if fn == "bare":
                    prepared = [engine.task.collate(engine.task.prepare(EmbedRequest(texts=c))) for c in chunks]

                    def call(j, prepared=prepared):
                        engine.backend.run(prepared[j % len(prepared)])
                else:
                    def call(j):
                        engine.run_sync(EmbedRequest(texts=chunks[j % len(chunks)]))
                call(0)
                lat = []
                cpu0 = time.process_time()
                start = time.perf_counter()
                j = 0
                while time.perf_counter() - start < duration:
                    t = time.perf_counter()
                    call(j)
                    lat.append(time.perf_counter() - t)
                    j += 1
                total = time.perf_counter() - start
                lat.sort()
                rows.append({"path": label, "texts": kind, "batch": batch,
                             "emb/s": j * batch / total, "p50 ms": statistics.median(lat) * 1000,
                             "cpu ms/batch": 1000 * (time.process_time() - cpu0) / j})
    return rows


def plain_feeds_maker(tokenizer_json: Path, max_length: int = 256):
    """texts → ONNX feeds the way a user writes it: the fast tokenizer, truncated to ``max_length``,
    each call padded to its longest text; int64 ids, mask and zero token types."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_truncation(max_length)
    tok.enable_padding()

    def feeds(texts: list[str]) -> dict:
        enc = tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    return feeds


def plain_session(graph: Path, threads: int):
    """An ONNX Runtime CPU session with default optimisations and ``threads`` intra-op threads.
    Returns feeds → the graph's first output (the inputs the graph lacks are dropped)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def run(feeds: dict):
        return session.run(None, {k: v for k, v in feeds.items() if k in names})[0]

    return run


def mean_pool(hidden, mask):
    import numpy as np

    m = mask[:, :, None].astype(np.float32)
    return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def plain_ort_embedder(graph: Path, tokenizer_json: Path, threads: int, max_length: int = 256):
    """The baseline a user writes by hand: the plain ``torch.onnx.export`` graph in an ONNX Runtime session
    (default optimisations, ``threads`` intra-op threads); each call pads its texts to the longest,
    tokenize → run → mean-pool → normalize. Returns the embed function (texts → float32 array)."""
    import numpy as np

    feeds_for, run = plain_feeds_maker(tokenizer_json, max_length), plain_session(graph, threads)

    def embed(chunk: list[str]) -> np.ndarray:
        feeds = feeds_for(chunk)
        pooled = mean_pool(run(feeds), feeds["attention_mask"])
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return embed


def plain_ort_loop(graph: Path, tokenizer_json: Path, texts: list[str], batch: int, duration: float,
                   threads: int, max_length: int = 256) -> float:
    """Times ``plain_ort_embedder`` over ``texts`` in order, in batches of ``batch``, in one process with
    ``threads`` cores, for ``duration`` seconds (after one warm-up batch). Returns embeddings/s."""
    embed = plain_ort_embedder(graph, tokenizer_json, threads, max_length)
    chunks = [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    embed(chunks[0])
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        embed(chunks[done % len(chunks)])
        done += 1
    return done * batch / (time.perf_counter() - start)


# ---- server process -------------------------------------------------------------------------------

def start_server(models: list[dict], port: int, threads: int | None, extra_env: dict) -> subprocess.Popen:
    env = {**os.environ, "TESSERA_MODELS": json.dumps(models), "HF_HUB_OFFLINE": "1", **extra_env}
    if threads:
        env["TESSERA_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "uvicorn", "core.dev:app", "--host", "127.0.0.1", "--port", str(port),
           "--no-access-log", "--log-level", "warning", "--loop", "uvloop", "--http", "httptools"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env)


def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float = 180) -> float:
    import httpx

    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return time.perf_counter() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("server not ready in time")


def ensure_onnx(model_path: Path) -> Path:
    """A folder without an ONNX graph is exported once into .venv/models/ (plain fp32 + both int8 flavours)."""
    if (model_path / "onnx" / "model.onnx").exists() or (model_path / "model.onnx").exists():
        return model_path
    from core.convert.onnx_export import export_folder

    out = ROOT / ".venv" / "models" / f"{model_path.name}-onnx"
    if not (out / "onnx" / "model_int8_accurate.onnx").exists():
        print(f"exporting {model_path} to {out} ...", flush=True)
        export_folder(model_path, out, int8=("fast", "accurate"))
    return out


def ensure_ct2(model_path: Path) -> Path:
    if (model_path / "ct2" / "model.bin").exists():
        return model_path
    from core.convert.ct2 import convert_folder

    out = ROOT / ".venv" / "models" / f"{model_path.name}-ct2"
    if not (out / "ct2" / "model.bin").exists():
        print(f"converting {model_path} to {out} ...", flush=True)
        convert_folder(model_path, out)
    return out


def print_table(rows: list[dict], title: str) -> None:
    if not rows:
        return
    cols = list(rows[0])
    print(f"\n### {title}\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r[c]
            cells.append(f"{v:.1f}" if isinstance(v, float) else ("" if v is None else str(v)))
        print("| " + " | ".join(cells) + " |")


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
            proc.terminate()
            proc.wait(30)
    print_table(result["http"], f"HTTP, closed loop ({args.duration:.0f} s per cell), {spec['backend']} {spec['dtype']}")
    print(f"\nstart → ready: {result['start_to_ready_s']:.1f} s; server peak RSS: {result['server_peak_rss_mb']} MB")
    if not args.no_inprocess:
        result["inprocess"] = inprocess_cells(
            {k: v for k, v in spec.items() if k != "name"}, kinds, batches, min(args.duration, 10), threads)
        print_table(result["inprocess"], "In-process (same model, same inputs)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
