#!/usr/bin/env python
"""CPU per one-text request through the app itself, in-process: no socket, no HTTP server, no load generator
in the count. The near-free model of scripts/bench_host_cpu.py (1 layer, hidden 32: what is left is the
serving layer), ONNX Runtime's intra-op spinning off (its busy-waiting threads would otherwise dominate the
process's CPU time), closed-loop callers sending POST /v1/embeddings through the ASGI app, on uvloop where it
is installed (as the servers run). Each measurement runs in a fresh process; with ``--baseline DIR`` the same is
measured from another checkout, interleaved.

    # this checkout against the commit before a change
    git worktree add --detach /tmp/before HEAD~1
    python scripts/bench_app_inprocess.py --baseline /tmp/before --rounds 3
    # 32 short texts per request instead of one
    python scripts/bench_app_inprocess.py --baseline /tmp/before --rounds 5 --batch 32 --requests 3200

Prints, per round and checkout, process CPU µs per request (every thread: the event loop, tokenization,
the inference threads) and requests/s, then the medians and the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "bench", "input": "a short text to embed here", "encoding_format": "base64"}


def body_for(batch: int) -> dict:
    """One text (the default request), or ``batch`` of the benchmarks' short texts (~13 tokens each)."""
    if batch == 1:
        return BODY
    from benchmarks.texts import make_texts

    return {**BODY, "input": make_texts("short", batch)}


async def measure(requests: int, concurrency: int, access_log: bool, batch: int = 1) -> dict:
    """In the child: the app of this checkout (``sys.path[0]``), its lifespan run, then ``requests`` calls."""
    from core.api.app import create_app
    from core.config import settings_from_env
    from core.logs import configure_logging

    settings = settings_from_env(os.environ)
    if access_log:
        configure_logging(settings.log_level, fmt=settings.log_format)
    app = create_app(settings)
    body = json.dumps(body_for(batch)).encode()
    life_in: asyncio.Queue = asyncio.Queue()
    life_out: asyncio.Queue = asyncio.Queue()
    await life_in.put({"type": "lifespan.startup"})
    lifespan = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                         life_in.get, life_out.put))
    started = await life_out.get()
    if started["type"] != "lifespan.startup.complete":
        raise SystemExit(f"the app did not start: {started}")

    async def one() -> None:
        sent, done, status = False, asyncio.Event(), []

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif not message.get("more_body"):
                done.set()

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "root_path": "", "scheme": "http",
                 "query_string": b"", "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8000), "state": {},
                 "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode()), (b"user-agent", b"bench")]}
        await app(scope, receive, send)
        if status != [200]:
            raise SystemExit(f"POST /v1/embeddings answered {status}")

    async def caller(n: int) -> None:
        for _ in range(n):
            await one()

    await asyncio.gather(*(caller(20) for _ in range(concurrency)))  # warm
    per_caller = max(1, requests // concurrency)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(per_caller) for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await life_in.put({"type": "lifespan.shutdown"})
    await life_out.get()
    await lifespan
    n = per_caller * concurrency
    return {"us_cpu_per_request": cpu / n * 1e6, "requests_per_s": n / wall}


def _loop_factory():
    """uvloop's loop where it is installed, as the servers run (``uvicorn --loop auto``); asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_child(root: Path, folder: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TESSERA_MODELS": json.dumps([{"path": str(folder), "name": "bench", "backend": "onnx",
                                          "dtype": "float32", "ort_spin": False}])}
    if not args.access_log:
        env["TESSERA_ACCESS_LOG"] = "false"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--requests", str(args.requests),
           "--batch", str(args.batch),
           "--concurrency", str(args.concurrency)] + (["--access-log"] if args.access_log else [])
    out = subprocess.run(cmd, cwd=root, env=env, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, help="another checkout of Tessera, measured interleaved")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=6400, help="requests per measurement")
    p.add_argument("--batch", type=int, default=1, help="texts per request (1, or that many short texts)")
    p.add_argument("--concurrency", type=int, default=64, help="closed-loop callers")
    p.add_argument("--access-log", action="store_true",
                   help="write the access log (to the child's stderr, discarded); off by default")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            print(json.dumps(runner.run(measure(args.requests, args.concurrency, args.access_log, args.batch))))
        return 0
    sys.path.insert(0, str(ROOT))
    from benchmarks.host_cpu import model_folder

    folder = model_folder("near-free")
    sides = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    cells: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(1, args.rounds + 1):
        for name, root in sides.items():
            cell = run_child(root, folder, args)
            cells[name].append(cell)
            per_text = f" ({cell['us_cpu_per_request'] / args.batch:.1f} per text)" if args.batch > 1 else ""
            print(f"round {r} {name:8s}: {cell['us_cpu_per_request']:.0f} µs CPU per request{per_text}, "
                  f"{cell['requests_per_s']:.0f} requests/s", flush=True)
    for name, cs in cells.items():
        print(f"median {name:8s}: {statistics.median(c['us_cpu_per_request'] for c in cs):.0f} µs CPU per request")
    if "baseline" in cells:
        ratios = [a["us_cpu_per_request"] / b["us_cpu_per_request"] for a, b in zip(cells["this"], cells["baseline"])]
        print("this ÷ baseline per round: " + ", ".join(f"{x:.2f}" for x in ratios)
              + f" (median {statistics.median(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
